"""dcgm-exporter's metric surface (``dcgmCompat.enabled``), so dashboards and alerts written for it keep working.

The 18 ``DCGM_FI_DEV_*`` families the Go agent emits plus ``DCGM_FI_DEV_XID_ERRORS`` (the last XID seen, labels
``err_code`` and ``err_msg``), with dcgm-exporter's HELP texts and types (its ``etc/dcp-metrics-included.csv``), its
units (framebuffer MiB, energy mJ, power W), its identity labels in its order (``gpu``, ``UUID``, ``pci_bus_id``,
``device="nvidia<N>"``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``) and its value formatting (integer
fields as integers, power as ``%f``). A field the hardware cannot answer reads 0, as dcgm-exporter reports it.
The readings, the GPUs and the driver version come from the gpu tier's snapshot (the collector's ``GpuResult`` of
that cycle); the last XIDs and the pod attribution are passed in as values.

Pod attribution (``dcgmCompat.podAttribution``, ``nvdaemon/gpu/podresources.py``): the series of a GPU a
container holds also carry ``container``, ``namespace`` and ``pod``, as dcgm-exporter 4.5.3-4.8.2 does in its
``--kubernetes`` mode: after its labels, among its other attributes in name order (so ``DCGM_FI_DEV_XID_ERRORS`` has
``container, err_code, err_msg, namespace, pod``), one series per GPU naming the last holder the kubelet listed (a
time-sliced GPU's replicas included); a MIG slice labels only dcgm-exporter's GPU-instance series, which are not
served here. An unallocated GPU's series, and every series while attribution is off, are unchanged.

Rendered as text rather than through prometheus_client, which would rename the four counters to ``*_total``. The
names are dcgm-exporter's, so ``promtool check metrics`` reports what it reports for dcgm-exporter itself: counters
without ``_total`` and the camelCase label ``modelName``; a drop-in must keep both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from nvdaemon.collectors.gpu import GpuCollector, GpuResult
from nvdaemon.compat.node_exporter.family import label_text
from nvdaemon.nvml import device_name

if TYPE_CHECKING:
    from nvdaemon.gpu.attribution import Attribution
    from nvdaemon.model import TierSnapshot

MIB = 1 << 20


def _int(v: float) -> str:
    return str(int(v))


def _float(v: float) -> str:
    return f"{v:f}"


def _mib(v: float) -> str:
    return str(int(v) // MIB)


def _milli(v: float) -> str:
    return str(round(v * 1000))


# name, type, HELP, our metric ("" = never answered here), value format
Family = tuple[str, str, str, str, Callable[[float], str]]
FAMILIES: tuple[Family, ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "gpu_sm_clock_mhz", _int),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "gpu_mem_clock_mhz", _int),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "gpu_memory_temperature_celsius", _int),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "gpu_temperature_celsius", _int),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "gpu_power_watts", _float),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "gpu_energy_joules_total",
        _milli,
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "gpu_pcie_replay_total", _int),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "gpu_utilization_pct", _int),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "gpu_mem_copy_util_pct", _int),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "gpu_encoder_util_pct", _int),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "gpu_decoder_util_pct", _int),
    # DCGM_FI_DEV_XID_ERRORS goes here (see XID_FAMILY)
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "gpu_mem_free_bytes", _mib),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "gpu_mem_used_bytes", _mib),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "gpu_mem_reserved_bytes", _mib),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "", _int),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        "gpu_remapped_rows_uncorrected_total",
        _int,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        "gpu_remapped_rows_corrected_total",
        _int,
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "gpu_row_remap_failed", _int),
)
XID_FAMILY = ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
XID_AFTER = "DCGM_FI_DEV_DEC_UTIL"
NO_ERROR = "No Error"


def pod_attributes(attribution: Attribution | None) -> dict[int, list[tuple[str, str]]]:
    """GPU index -> dcgm-exporter's pod attributes (name order) for the GPUs a container holds; {} while off."""
    if attribution is None:
        return {}
    return {
        index: [("container", h.container), ("namespace", h.namespace), ("pod", h.pod)]
        for index, h in attribution.dcgm.items()
    }


def render_dcgm(
    gpu: TierSnapshot | None,
    *,
    enabled: bool,
    node: str,
    last_xid: Mapping[int, int],
    pods: Mapping[int, Sequence[tuple[str, str]]],
) -> bytes:
    """The dcgm-exporter exposition of the gpu tier's snapshot ``gpu``; empty unless ``enabled`` (dcgmCompat.enabled)
    and that cycle produced a GPU result (none: NVML not opened, or the cycle's read timed out).

    ``node`` is the ``Hostname`` label, ``last_xid`` the last XID per GPU index (XIDs arrive between cycles, from
    the XID source), ``pods`` the pod attributes per GPU index (``pod_attributes``).
    """
    result = gpu.results.get(GpuCollector.name) if gpu is not None else None
    if not enabled or not isinstance(result, GpuResult):
        return b""
    from nvdaemon.gpu.events import xid_description

    values = {(s.device, s.metric): s.value for s in result.samples}
    gpus = result.gpus
    identity = {
        g.index: [
            ("gpu", str(g.index)),
            ("UUID", g.uuid),
            ("pci_bus_id", g.pci_bus_id),
            ("device", f"nvidia{g.index}"),
            ("modelName", g.name),
            ("Hostname", node),
            ("DCGM_FI_DRIVER_VERSION", result.driver_version),
        ]
        for g in gpus
    }
    lines: list[str] = []
    for name, kind, help_text, metric, fmt in FAMILIES:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for g in gpus:
            value = values.get((device_name(g.index), metric), 0.0) if metric else 0.0
            lines.append(f"{name}{{{label_text([*identity[g.index], *pods.get(g.index, [])])}}} {fmt(value)}")
        if name == XID_AFTER:
            xname, xkind, xhelp = XID_FAMILY
            lines += [f"# HELP {xname} {xhelp}", f"# TYPE {xname} {xkind}"]
            for g in gpus:
                xid = last_xid.get(g.index, 0)
                msg = xid_description(xid) if xid else NO_ERROR
                attributes = sorted([("err_code", str(xid)), ("err_msg", msg), *pods.get(g.index, [])])
                lines.append(f"{xname}{{{label_text(identity[g.index] + attributes)}}} {xid}")
    return ("\n".join(lines) + "\n").encode()
