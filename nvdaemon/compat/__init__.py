"""Drop-in metric surfaces of other exporters (dcgm-exporter, …), opt-in per config."""
