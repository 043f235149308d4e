"""nvdaemon: one supervised agent per node for hardware telemetry and hardware events."""

__version__ = "0.1.0"
