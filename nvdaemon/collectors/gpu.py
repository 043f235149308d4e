"""The gpu tier's collector: one NVML snapshot per GPU per tick, through the GPU runtime's backend.

*gather* (worker thread, under the runtime's NVML limiter): device count, then a snapshot of every GPU; a lost GPU
is noted, not fatal; a device count NVML cannot answer (the library stopped answering) marks every known GPU lost.
*interpret* (event loop): samples per GPU (device ``gpu<index>``, labels ``gpu_uuid``, ``gpu_model``,
``pci_bus_id``), ``gpu_lost`` transitions published through the runtime, and the XID counts; its result
(``GpuResult``) also carries the GPUs known then and the driver version, which the dcgm-exporter surface renders.
``gpu_samples`` and ``decode_throttle`` are pure.

Names, kinds and labels are the Go agent's 21 per GPU plus ``gpu_throttle_active{reason}`` (ECC counts aggregate,
energy mJ / 1000). Two deliberate differences: a reading NVML does not support has no sample (Go reports 0, which
would read as a real 0 °C or 0 W), and ``gpu_throttle_active`` is 0 for a non-benign reason that is not set (Go
emits only the set ones) so that a rule on it sees the reason clear and EXITs instead of going stale.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from nvdaemon.collectors.base import Collector, Gathered, HostRoots, Interpreted, NotPresent
from nvdaemon.model import Kind, Sample, make_labels
from nvdaemon.nvml import GpuIdentity, GpuLost, GpuSnapshot, NvmlBackend, NvmlFailure, device_name

# NVML's clocks event (throttle) reasons that mean the GPU is slowed by something other than idleness or an
# application's clock setting (nvmlClocksEventReason*; tests check these against pynvml's constants).
THROTTLE_REASONS: dict[str, int] = {
    "sw_power_cap": 0x04,
    "hw_slowdown": 0x08,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
}

# reading -> (metric, kind, scale to the metric's unit)
_SIMPLE: tuple[tuple[str, str, Kind, float], ...] = (
    ("utilization_gpu", "gpu_utilization_pct", Kind.GAUGE, 1.0),
    ("utilization_memory", "gpu_mem_copy_util_pct", Kind.GAUGE, 1.0),
    ("encoder_util", "gpu_encoder_util_pct", Kind.GAUGE, 1.0),
    ("decoder_util", "gpu_decoder_util_pct", Kind.GAUGE, 1.0),
    ("memory_used", "gpu_mem_used_bytes", Kind.GAUGE, 1.0),
    ("memory_free", "gpu_mem_free_bytes", Kind.GAUGE, 1.0),
    ("memory_total", "gpu_mem_total_bytes", Kind.GAUGE, 1.0),
    ("memory_reserved", "gpu_mem_reserved_bytes", Kind.GAUGE, 1.0),
    ("temperature_gpu", "gpu_temperature_celsius", Kind.GAUGE, 1.0),
    ("temperature_memory", "gpu_memory_temperature_celsius", Kind.GAUGE, 1.0),
    ("power_usage_mw", "gpu_power_watts", Kind.GAUGE, 1e-3),
    ("total_energy_mj", "gpu_energy_joules_total", Kind.COUNTER, 1e-3),
    ("clock_sm_mhz", "gpu_sm_clock_mhz", Kind.GAUGE, 1.0),
    ("clock_mem_mhz", "gpu_mem_clock_mhz", Kind.GAUGE, 1.0),
    ("throttle_reasons", "gpu_throttle_reasons", Kind.GAUGE, 1.0),
    ("ecc_corrected_aggregate", "gpu_ecc_corrected_total", Kind.COUNTER, 1.0),
    ("ecc_uncorrected_aggregate", "gpu_ecc_uncorrected_total", Kind.COUNTER, 1.0),
    ("pcie_replay", "gpu_pcie_replay_total", Kind.COUNTER, 1.0),
    ("remapped_rows_correctable", "gpu_remapped_rows_corrected_total", Kind.COUNTER, 1.0),
    ("remapped_rows_uncorrectable", "gpu_remapped_rows_uncorrected_total", Kind.COUNTER, 1.0),
    ("remapped_rows_failure", "gpu_row_remap_failed", Kind.GAUGE, 1.0),
)


def decode_throttle(mask: int) -> dict[str, bool]:
    """Which of the non-benign throttle reasons are set in an NVML clocks event reasons mask."""
    return {reason: bool(mask & bit) for reason, bit in THROTTLE_REASONS.items()}


def gpu_labels(ident: GpuIdentity) -> dict[str, str]:
    return {"gpu_uuid": ident.uuid, "gpu_model": ident.name, "pci_bus_id": ident.pci_bus_id}


def gpu_samples(snap: GpuSnapshot, now: float) -> list[Sample]:
    """The samples of one GPU's snapshot; a reading NVML did not give has no sample."""
    base = gpu_labels(snap.identity)
    labels = make_labels(base)
    device = device_name(snap.identity.index)
    r = snap.readings
    out = []
    for reading, metric, kind, scale in _SIMPLE:
        if reading in r:
            out.append(Sample(metric, device, r[reading] * scale, kind, labels, "gpu", now))
    if "throttle_reasons" in r:
        for reason, active in decode_throttle(int(r["throttle_reasons"])).items():
            reason_labels = make_labels({**base, "reason": reason})
            value = 1.0 if active else 0.0
            out.append(Sample("gpu_throttle_active", device, value, Kind.GAUGE, reason_labels, "gpu", now))
    return out


@dataclass(frozen=True)
class GpuResult(Interpreted):
    """One gpu cycle: the samples, and every GPU the runtime knows then (index order) with the driver version, for
    the dcgm-exporter surface (which lists a GPU that did not answer, with zeros)."""

    gpus: tuple[GpuIdentity, ...]
    driver_version: str


@dataclass
class _Lost:
    index: int
    error: str


@dataclass
class _NvmlDown:
    error: str


class GpuSource(Protocol):
    """What the collector reads and tells of the GPU runtime (``nvdaemon.gpu.GpuRuntime``, which sits above the
    collectors): its NVML backend, the GPUs it knows, its XID counts, and the lost/answering transitions it
    publishes."""

    @property
    def backend(self) -> NvmlBackend: ...
    @property
    def identities(self) -> Mapping[int, GpuIdentity]: ...
    @property
    def driver_version(self) -> str: ...
    @property
    def xid_counts(self) -> Mapping[tuple[int, int], int]: ...
    def identity(self, index: int | None) -> GpuIdentity: ...
    def learn(self, ident: GpuIdentity) -> None: ...
    def set_lost(self, ident: GpuIdentity, lost: bool, now: float, error: str = "") -> None: ...
    def nvml_down(self, error: str, now: float) -> None: ...
    def pod_attribution_status(self) -> dict[str, Any] | None: ...  # None: pod attribution is not running


class GpuCollector(Collector):
    name: ClassVar[str] = "nvml"
    tier: ClassVar[str] = "gpu"

    def __init__(self, runtime: GpuSource | None = None) -> None:
        self.runtime = runtime

    def gather(self, roots: HostRoots) -> Gathered:
        rt = self.runtime
        if rt is None:  # the tier runs without an opened NVML (added by a reload): nothing to read
            raise NotPresent("NVML not opened")
        results: list[GpuSnapshot | _Lost] = []
        errors: list[str] = []
        try:
            count = rt.backend.device_count()
        except NvmlFailure as exc:  # not one GPU: the library itself; the runtime reports every GPU it knew
            return Gathered(_NvmlDown(str(exc)), [str(exc)])
        for index in range(count):
            try:
                snap = rt.backend.snapshot(index)
            except GpuLost as exc:
                results.append(_Lost(index, str(exc)))
                continue
            results.append(snap)
            errors.extend(snap.errors)
        return Gathered(results, errors)

    def detail(self) -> dict[str, Any]:
        """Pod attribution's state (``dcgmCompat.podAttribution``), when it runs."""
        status = self.runtime.pod_attribution_status() if self.runtime is not None else None
        return {"podAttribution": status} if status is not None else {}

    def interpret(self, gathered: Gathered, now: float) -> GpuResult:
        rt = self.runtime
        assert rt is not None
        samples: list[Sample] = []
        if isinstance(gathered.data, _NvmlDown):
            rt.nvml_down(gathered.data.error, now)
            return self._result(rt, samples)
        for item in gathered.data:
            if isinstance(item, _Lost):
                rt.set_lost(rt.identity(item.index), True, now, item.error)
                continue
            rt.learn(item.identity)
            rt.set_lost(rt.identity(item.identity.index), False, now)
            samples += gpu_samples(item, now)
        for (index, xid), n in sorted(rt.xid_counts.items()):
            labels = make_labels({**gpu_labels(rt.identity(index)), "xid": str(xid)})
            samples.append(
                Sample("gpu_xid_errors_total", device_name(index), float(n), Kind.COUNTER, labels, "gpu", now)
            )
        return self._result(rt, samples)

    @staticmethod
    def _result(rt: GpuSource, samples: list[Sample]) -> GpuResult:
        gpus = tuple(rt.identities[i] for i in sorted(rt.identities))  # GpuIdentity is frozen: a copy is a value
        return GpuResult(tuple(samples), gpus=gpus, driver_version=rt.driver_version)
