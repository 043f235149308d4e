"""NVML behind a narrow interface: device count, per-device snapshot, XID wait.

Two backends implement ``NvmlBackend``: ``real.RealNvml`` on nvidia-ml-py (``pynvml``, which dlopens libnvidia-ml at
run time) and ``fake.FakeNvml``, which replays a recorded scenario from ``fixtures/nvml/``. Every method is
synchronous and blocking: callers run them in worker threads under the GPU runtime's own ``trio.CapacityLimiter``.

A snapshot is a flat mapping of reading names (``READINGS``, in NVML's own units) to numbers. A reading NVML cannot
answer (NOT_SUPPORTED, or an old driver without the function) is simply absent; any other failure of one call is
listed in ``errors`` and the other readings are kept. A GPU that fell off the bus raises ``GpuLost``.

Strings NVML gives (name, UUID, PCI bus id, MIG UUIDs, driver version) become labels and event fields: each is cut
to ``TEXT_MAX`` characters (``bounded_text``; ``GpuIdentity`` cuts its own fields), whichever backend made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

READINGS: tuple[str, ...] = (
    "utilization_gpu",  # percent, nvmlDeviceGetUtilizationRates().gpu
    "utilization_memory",  # percent, nvmlDeviceGetUtilizationRates().memory (memory copy engine)
    "encoder_util",  # percent, nvmlDeviceGetEncoderUtilization()[0]
    "decoder_util",  # percent, nvmlDeviceGetDecoderUtilization()[0]
    "memory_total",  # bytes, nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)
    "memory_used",
    "memory_free",
    "memory_reserved",
    "temperature_gpu",  # Celsius, nvmlDeviceGetTemperature(handle, NVML_TEMPERATURE_GPU)
    "temperature_memory",  # Celsius, field NVML_FI_DEV_MEMORY_TEMP
    "power_usage_mw",  # milliwatts, nvmlDeviceGetPowerUsage
    "total_energy_mj",  # millijoules since the driver loaded, nvmlDeviceGetTotalEnergyConsumption
    "clock_sm_mhz",  # nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM)
    "clock_mem_mhz",  # nvmlDeviceGetClockInfo(handle, NVML_CLOCK_MEM)
    "throttle_reasons",  # bitmask, nvmlDeviceGetCurrentClocksEventReasons (…ThrottleReasons on old drivers)
    "ecc_corrected_aggregate",  # nvmlDeviceGetTotalEccErrors(handle, CORRECTED, NVML_AGGREGATE_ECC)
    "ecc_uncorrected_aggregate",  # nvmlDeviceGetTotalEccErrors(handle, UNCORRECTED, NVML_AGGREGATE_ECC)
    "pcie_replay",  # nvmlDeviceGetPcieReplayCounter
    "remapped_rows_correctable",  # nvmlDeviceGetRemappedRows()[0]
    "remapped_rows_uncorrectable",  # [1]
    "remapped_rows_pending",  # [2]
    "remapped_rows_failure",  # [3]
)

# One XID wait; also the bound on how long cancelling the XID source takes (a shutdown, a reload of the gpu tier:
# NVML has no way to end a wait early). An XID ends a wait at once, so only an idle node's wakeups depend on it: each
# costs the agent about 0.1 ms of CPU (a thread woken after sleeping, our loop, the library's return), 1.5-2 ms a
# 15 s tick at 1 s, a tenth of the CPU of the agent with every tier that bench/steady.py runs (its threads' CPU
# from /proc/<pid>/task); at 3 s a third of that, and a shutdown within the default 10 s grace still leaves the
# sinks 7 s.
XID_WAIT_MS = 3000
# The longest NVML string kept. NVML's own buffers hold at most 96 bytes (device name, UUID; the driver version 80,
# the PCI bus id 32), so a real value is never cut; a longer one (a broken binding, a scenario file) is not a name.
TEXT_MAX = 256
MIG_MAX = 64  # MIG device UUIDs kept per GPU: NVML reports at most 7 MIG devices on today's GPUs


def bounded_text(value: str) -> str:
    """``value`` cut to ``TEXT_MAX`` characters."""
    return value[:TEXT_MAX]


class NvmlUnavailable(Exception):
    """NVML cannot be used on this node (library missing, driver not loaded): the gpu tier is skipped."""


class NvmlFailure(Exception):
    """NVML answered with an error the agent cannot work around (the supervisor restarts the caller)."""


class GpuLost(Exception):
    """The GPU fell off the bus or is otherwise inaccessible (NVML_ERROR_GPU_IS_LOST)."""


@dataclass(frozen=True)
class GpuIdentity:
    index: int
    uuid: str = ""
    name: str = ""
    pci_bus_id: str = ""
    # UUIDs of the MIG devices on this GPU (``MIG-…``), how a device plugin names a slice: pod attribution maps them
    # to this GPU. Empty without MIG mode.
    mig_uuids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Every string cut to ``TEXT_MAX``, at most ``MIG_MAX`` MIG UUIDs: an identity is a label set."""
        for name in ("uuid", "name", "pci_bus_id"):
            value = getattr(self, name)
            if len(value) > TEXT_MAX:
                object.__setattr__(self, name, bounded_text(value))
        if len(self.mig_uuids) > MIG_MAX or any(len(u) > TEXT_MAX for u in self.mig_uuids):
            object.__setattr__(self, "mig_uuids", tuple(bounded_text(u) for u in self.mig_uuids[:MIG_MAX]))


def device_name(index: int) -> str:
    """The agent's device name for a GPU (samples, events, dcgm lookups): ``gpu<index>``, ``gpu`` when unknown (-1)."""
    return f"gpu{index}" if index >= 0 else "gpu"


@dataclass
class GpuSnapshot:
    identity: GpuIdentity
    readings: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class XidNotice:
    """One XidCriticalError reported by NVML's event set: the GPU's index (None if NVML could not say) and code."""

    index: int | None
    xid: int


class NvmlBackend(Protocol):
    def open(self) -> list[GpuIdentity]:
        """nvmlInit and enumerate the GPUs; raises ``NvmlUnavailable`` when NVML cannot be used at all."""

    def driver_version(self) -> str: ...

    def device_count(self) -> int: ...

    def snapshot(self, index: int) -> GpuSnapshot:
        """Every reading of one GPU, best effort; raises ``GpuLost``."""

    def xid_open(self) -> list[str]:
        """Create the event set and register XidCriticalError on every GPU that supports it; returns one message per
        GPU that could not be registered (logged by the caller, never fatal)."""

    def xid_registered(self) -> int: ...

    def xid_wait(self, timeout_ms: int) -> list[XidNotice]:
        """Wait up to ``timeout_ms`` for XIDs; an empty list on timeout."""

    def xid_close(self) -> None:
        """Free the event set. Only called once no wait is in flight."""

    def close(self) -> None:
        """nvmlShutdown."""


__all__ = [
    "MIG_MAX",
    "READINGS",
    "TEXT_MAX",
    "XID_WAIT_MS",
    "GpuIdentity",
    "GpuLost",
    "GpuSnapshot",
    "NvmlBackend",
    "NvmlFailure",
    "NvmlUnavailable",
    "XidNotice",
    "bounded_text",
    "device_name",
]
