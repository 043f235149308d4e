"""The real NVML backend on nvidia-ml-py.

``RealNvml(lib)`` takes the ``pynvml`` module as an object (tests pass a stand-in with the same function names and
signatures that records the calls made). Every call is best effort: NOT_SUPPORTED and FUNCTION_NOT_FOUND (a driver
older than the binding) omit that reading; GPU_IS_LOST raises ``GpuLost``; any other error is listed in the
snapshot's ``errors`` and the other readings are kept.

Not thread-confined: NVML is thread-safe, and the callers run each method in a worker thread under the GPU
runtime's limiter. The XID wait (``nvmlEventSetWait_v2``) blocks its thread for at most ``timeout_ms``; the XID
source opens and frees the event set around its waits, never during one, so no lock guards it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from nvdaemon.nvml import (
    MIG_MAX,
    TEXT_MAX,
    GpuIdentity,
    GpuLost,
    GpuSnapshot,
    NvmlFailure,
    NvmlUnavailable,
    XidNotice,
    bounded_text,
)

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    """An NVML string (bytes from older bindings, str from newer ones), cut to ``TEXT_MAX`` characters before it is
    decoded or copied whole."""
    if isinstance(value, bytes):
        return bounded_text(value[: TEXT_MAX * 4].decode("utf-8", errors="replace"))  # 4: UTF-8's longest character
    return bounded_text(str(value))


def load_pynvml() -> Any:
    import pynvml  # type: ignore[import-untyped]

    return pynvml


class RealNvml:
    """NVML through nvidia-ml-py; ``lib`` is the ``pynvml`` module or a stand-in with its names."""

    def __init__(self, lib: Any = None) -> None:
        self.lib = load_pynvml() if lib is None else lib
        self._handles: dict[int, Any] = {}
        self._identities: dict[int, GpuIdentity] = {}
        self._event_set: Any = None
        self._registered: list[int] = []
        self._no_mig: set[int] = set()  # GPUs that answered NOT_SUPPORTED to nvmlDeviceGetMigMode: never asked again
        # (index, what) already warned about: a GPU lost before the agent started is asked every tick, logged once
        self._warned: set[tuple[int, str]] = set()

    # ---- error classification -----------------------------------------------------------------------------------
    def _code(self, exc: BaseException) -> int | None:
        value = getattr(exc, "value", None)
        return value if isinstance(value, int) else None

    def _omit(self, code: int | None) -> bool:
        lib = self.lib
        return code in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND)

    def _call(self, snap: GpuSnapshot, what: str, fn: Callable[[], Any]) -> Any:
        """Run one NVML call for ``snap``: None when it cannot answer; GpuLost propagates."""
        try:
            return fn()
        except self.lib.NVMLError as exc:
            return self._failed(snap, what, exc)

    def _put(self, snap: GpuSnapshot, key: str, fn: Callable[[], Any], what: str = "") -> None:
        """One reading from one NVML call (``what`` names it in errors, the reading's name by default)."""
        value = self._call(snap, what or key, fn)
        if value is not None:
            snap.readings[key] = float(value)

    def _failed(self, snap: GpuSnapshot, what: str, exc: BaseException) -> None:
        """A reading NVML did not give: omitted, listed as an error, or the GPU is lost."""
        code = self._code(exc)
        if code == self.lib.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(f"gpu{snap.identity.index}: {exc}") from exc
        if not self._omit(code):
            snap.errors.append(f"gpu{snap.identity.index} {what}: {exc}")

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def open(self) -> list[GpuIdentity]:
        lib = self.lib
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            raise NvmlUnavailable(f"nvmlInit: {exc}") from exc
        try:
            count = lib.nvmlDeviceGetCount()
        except lib.NVMLError as exc:
            lib.nvmlShutdown()
            raise NvmlUnavailable(f"nvmlDeviceGetCount: {exc}") from exc
        out = []
        for index in range(count):
            out.append(self._identity(index))
        return out

    def _identity(self, index: int) -> GpuIdentity:
        lib = self.lib
        try:
            handle = self._handles.get(index)
            if handle is None:
                handle = self._handles[index] = lib.nvmlDeviceGetHandleByIndex(index)
        except lib.NVMLError as exc:
            self._warn_once(index, "handle", f"gpu{index}: no handle: {exc}")
            return GpuIdentity(index)
        if index in self._identities:
            return self._identities[index]
        parts: dict[str, str] = {}
        calls: tuple[tuple[str, Callable[[], Any]], ...] = (
            ("uuid", lambda: lib.nvmlDeviceGetUUID(handle)),
            ("name", lambda: lib.nvmlDeviceGetName(handle)),
            ("pci_bus_id", lambda: lib.nvmlDeviceGetPciInfo(handle).busId),
        )
        for key, fn in calls:
            try:
                parts[key] = _text(fn())
            except lib.NVMLError as exc:
                self._warn_once(index, key, f"gpu{index}: {key} unknown: {exc}")
        ident = GpuIdentity(index, **parts, mig_uuids=self._mig_uuids(index, handle))
        if ident.uuid:  # complete enough to keep; a lost GPU is asked again later
            self._identities[index] = ident
        return ident

    def _warn_once(self, index: int, what: str, message: str) -> None:
        if (index, what) in self._warned:
            log.debug("%s", message)
            return
        self._warned.add((index, what))
        log.warning("%s", message)

    def _mig_uuids(self, index: int, handle: Any) -> tuple[str, ...]:
        """The UUIDs of the MIG devices on a GPU in MIG mode (how device plugins name slices); () otherwise."""
        lib = self.lib
        if index in self._no_mig:
            return ()
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
            if current != lib.NVML_DEVICE_MIG_ENABLE:
                return ()
            slots = min(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle)), MIG_MAX)
        except lib.NVMLError as exc:
            if self._omit(self._code(exc)):
                self._no_mig.add(index)
            return ()
        out = []
        for slot in range(slots):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
                out.append(_text(lib.nvmlDeviceGetUUID(mig)))
            except lib.NVMLError:  # NOT_FOUND: an empty slot
                continue
        return tuple(out)

    def driver_version(self) -> str:
        try:
            return _text(self.lib.nvmlSystemGetDriverVersion())
        except self.lib.NVMLError:
            return ""

    def device_count(self) -> int:
        try:
            count: int = self.lib.nvmlDeviceGetCount()
        except self.lib.NVMLError as exc:
            raise NvmlFailure(f"nvmlDeviceGetCount: {exc}") from exc
        return count

    def close(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except self.lib.NVMLError as exc:
            log.warning("nvmlShutdown: %s", exc)

    # ---- samples ------------------------------------------------------------------------------------------------
    def snapshot(self, index: int) -> GpuSnapshot:
        lib = self.lib
        ident = self._identity(index)
        handle = self._handles.get(index)
        if handle is None:
            raise GpuLost(f"gpu{index}: no handle")
        if ident.uuid:  # MIG devices come and go with a reconfiguration: re-read (one call on a GPU without MIG)
            mig = self._mig_uuids(index, handle)
            if mig != ident.mig_uuids:
                ident = self._identities[index] = dataclasses.replace(ident, mig_uuids=mig)
        snap = GpuSnapshot(ident)
        r = snap.readings

        util = self._call(snap, "utilization", lambda: lib.nvmlDeviceGetUtilizationRates(handle))
        if util is not None:
            r["utilization_gpu"], r["utilization_memory"] = float(util.gpu), float(util.memory)
        self._put(snap, "encoder_util", lambda: lib.nvmlDeviceGetEncoderUtilization(handle)[0], "encoder")
        self._put(snap, "decoder_util", lambda: lib.nvmlDeviceGetDecoderUtilization(handle)[0], "decoder")
        self._memory(snap, handle)
        temp_gpu = lib.NVML_TEMPERATURE_GPU
        self._put(snap, "temperature_gpu", lambda: lib.nvmlDeviceGetTemperature(handle, temp_gpu), "temperature")
        mem_temp = self._field(snap, handle, lib.NVML_FI_DEV_MEMORY_TEMP, "memory temperature")
        if mem_temp is not None:
            r["temperature_memory"] = mem_temp
        self._put(snap, "power_usage_mw", lambda: lib.nvmlDeviceGetPowerUsage(handle), "power")
        self._put(snap, "total_energy_mj", lambda: lib.nvmlDeviceGetTotalEnergyConsumption(handle), "energy")
        self._put(snap, "clock_sm_mhz", lambda: lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_SM), "sm clock")
        self._put(snap, "clock_mem_mhz", lambda: lib.nvmlDeviceGetClockInfo(handle, lib.NVML_CLOCK_MEM), "memory clock")
        reasons = self._throttle(snap, handle)
        if reasons is not None:
            r["throttle_reasons"] = float(reasons)
        # aggregate ECC counters: the volatile ones reset on every driver reload
        ecc, aggregate = lib.nvmlDeviceGetTotalEccErrors, lib.NVML_AGGREGATE_ECC
        corrected, uncorrected = lib.NVML_MEMORY_ERROR_TYPE_CORRECTED, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        self._put(snap, "ecc_corrected_aggregate", lambda: ecc(handle, corrected, aggregate))
        self._put(snap, "ecc_uncorrected_aggregate", lambda: ecc(handle, uncorrected, aggregate))
        self._put(snap, "pcie_replay", lambda: lib.nvmlDeviceGetPcieReplayCounter(handle), "pcie replay")
        rows = self._call(snap, "remapped rows", lambda: lib.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:
            corr, unc, pending, failure = rows
            r["remapped_rows_correctable"] = float(corr)
            r["remapped_rows_uncorrectable"] = float(unc)
            r["remapped_rows_pending"] = float(pending)
            r["remapped_rows_failure"] = float(failure)
        return snap

    def _memory(self, snap: GpuSnapshot, handle: Any) -> None:
        lib = self.lib
        try:
            info = lib.nvmlDeviceGetMemoryInfo(handle, version=lib.nvmlMemory_v2)
            reserved: float | None = float(info.reserved)
        except lib.NVMLError as exc:
            if not self._omit(self._code(exc)):
                self._failed(snap, "memory", exc)
                return
            # A driver without the v2 struct: total/used/free only.
            info = self._call(snap, "memory", lambda: lib.nvmlDeviceGetMemoryInfo(handle))
            if info is None:
                return
            reserved = None
        r = snap.readings
        r["memory_total"], r["memory_used"], r["memory_free"] = float(info.total), float(info.used), float(info.free)
        if reserved is not None:
            r["memory_reserved"] = reserved

    def _throttle(self, snap: GpuSnapshot, handle: Any) -> Any:
        lib = self.lib
        newer = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None:
            try:
                return newer(handle)
            except lib.NVMLError as exc:
                if self._code(exc) != lib.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self._failed(snap, "throttle reasons", exc)
                    return None
        return self._call(snap, "throttle reasons", lambda: lib.nvmlDeviceGetCurrentClocksThrottleReasons(handle))

    def _field(self, snap: GpuSnapshot, handle: Any, field_id: int, what: str) -> float | None:
        lib = self.lib
        values = self._call(snap, what, lambda: lib.nvmlDeviceGetFieldValues(handle, [field_id]))
        if values is None:
            return None
        v = values[0]
        if v.nvmlReturn != lib.NVML_SUCCESS:
            self._failed(snap, what, lib.NVMLError(v.nvmlReturn))
            return None
        member = {
            lib.NVML_VALUE_TYPE_DOUBLE: "dVal",
            lib.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            lib.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            lib.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            lib.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            lib.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
            lib.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
        }.get(v.valueType, "uiVal")
        return float(getattr(v.value, member))

    # ---- XID events ---------------------------------------------------------------------------------------------
    def xid_open(self) -> list[str]:
        lib = self.lib
        problems: list[str] = []
        try:
            event_set = lib.nvmlEventSetCreate()
        except lib.NVMLError as exc:
            raise NvmlFailure(f"nvmlEventSetCreate: {exc}") from exc
        registered = []
        for index in sorted(self._handles):
            handle = self._handles[index]
            try:
                supported = lib.nvmlDeviceGetSupportedEventTypes(handle)
                mask = supported & lib.nvmlEventTypeXidCriticalError
                if not mask:
                    problems.append(f"gpu{index}: supports no XID events")
                    continue
                lib.nvmlDeviceRegisterEvents(handle, mask, event_set)
                registered.append(index)
            except lib.NVMLError as exc:
                problems.append(f"gpu{index}: XID events not registered: {exc}")
        self._event_set, self._registered = event_set, registered
        return problems

    def xid_registered(self) -> int:
        return len(self._registered)

    def xid_wait(self, timeout_ms: int) -> list[XidNotice]:
        lib = self.lib
        event_set = self._event_set
        if event_set is None:
            raise NvmlFailure("XID wait without an event set")
        try:
            data = lib.nvmlEventSetWait_v2(event_set, timeout_ms)
        except lib.NVMLError as exc:
            if self._code(exc) == lib.NVML_ERROR_TIMEOUT:
                return []
            raise NvmlFailure(f"nvmlEventSetWait_v2: {exc}") from exc
        if not data.eventType & lib.nvmlEventTypeXidCriticalError:
            return []
        index: int | None
        try:
            index = int(lib.nvmlDeviceGetIndex(data.device))
        except lib.NVMLError:
            index = None
        return [XidNotice(index, int(data.eventData))]

    def xid_close(self) -> None:
        event_set, self._event_set, self._registered = self._event_set, None, []
        if event_set is not None:
            try:
                self.lib.nvmlEventSetFree(event_set)
            except self.lib.NVMLError as exc:
                log.warning("nvmlEventSetFree: %s", exc)
