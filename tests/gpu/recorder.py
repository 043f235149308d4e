"""A stand-in for the ``pynvml`` module that records every call made to it.

Only the functions the real backend is meant to call exist here, each with the parameter names of nvidia-ml-py
(``test_recorder_signatures_match_pynvml`` holds them to the installed module), so a misspelt function name is an
AttributeError and a wrong argument order or count is a TypeError or a wrong value. Constants and error classes are
the real module's. Per-GPU answers come from ``answers[index][function]``: a value, or an ``int`` error code under
``errors[index][function]`` raised as the matching ``pynvml.NVMLError`` subclass.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml  # type: ignore[import-untyped]

_COPIED = ("NVML_", "NVMLError", "nvmlClocks", "nvmlEventType", "nvmlMemory_v2")


class Handle:
    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"h{self.index}"


class MigHandle:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid


class EventSet:
    def __repr__(self) -> str:
        return "es"


class RecordingNvml:
    def __init__(self, gpus: int = 2, *, init_error: int | None = None) -> None:
        for name in dir(pynvml):
            if name.startswith(_COPIED):
                setattr(self, name, getattr(pynvml, name))
        self.calls: list[tuple[Any, ...]] = []
        self.handles = [Handle(i) for i in range(gpus)]
        self.init_error = init_error
        self.errors: dict[int, dict[str, int]] = {i: {} for i in range(gpus)}
        self.supported_events: dict[int, int] = {i: pynvml.nvmlEventTypeXidCriticalError | 0x1 for i in range(gpus)}
        self.event_queue: list[tuple[int, int]] = []  # (gpu, xid) answered by the next waits
        self.event_set = EventSet()
        self.mig: dict[int, list[str]] = {}

    def _do(self, name: str, handle: Handle | None, *args: Any) -> None:
        self.calls.append((name, handle, *args) if handle is not None else (name, *args))
        if handle is not None:
            assert isinstance(handle, Handle), f"{name}: first argument must be a device handle, got {handle!r}"
            code = self.errors[handle.index].get(name)
            if code is not None:
                raise pynvml.NVMLError(code)

    # ---- lifecycle
    def nvmlInit(self) -> None:
        self._do("nvmlInit", None)
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self._do("nvmlShutdown", None)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._do("nvmlSystemGetDriverVersion", None)
        return "550.90.07"

    def nvmlDeviceGetCount(self) -> int:
        self._do("nvmlDeviceGetCount", None)
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._do("nvmlDeviceGetHandleByIndex", None, index)
        return self.handles[index]

    def nvmlDeviceGetIndex(self, handle: Handle) -> int:
        self._do("nvmlDeviceGetIndex", handle)
        return handle.index

    # ---- identity
    def nvmlDeviceGetUUID(self, handle: Handle | MigHandle) -> str:
        if isinstance(handle, MigHandle):
            self.calls.append(("nvmlDeviceGetUUID", handle))
            return handle.uuid
        self._do("nvmlDeviceGetUUID", handle)
        return f"GPU-0000000{handle.index}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetName(self, handle: Handle) -> str:
        self._do("nvmlDeviceGetName", handle)
        return "NVIDIA H200"

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        self._do("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=f"00000000:{0x18 + handle.index:02X}:00.0".encode())

    # ---- MIG (``mig[index]``: MIG device UUIDs of a GPU in MIG mode; an index not there has MIG disabled)
    def nvmlDeviceGetMigMode(self, device: Handle) -> list[int]:
        self._do("nvmlDeviceGetMigMode", device)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if device.index in self.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Handle) -> int:
        self._do("nvmlDeviceGetMaxMigDeviceCount", device)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Handle, index: int) -> MigHandle:
        self._do("nvmlDeviceGetMigDeviceHandleByIndex", device, index)
        uuids = self.mig.get(device.index, [])
        if index >= len(uuids):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return MigHandle(uuids[index])

    # ---- readings (distinct values per argument, so swapped arguments give wrong numbers)
    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        self._do("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=91 + handle.index, memory=33)

    def nvmlDeviceGetEncoderUtilization(self, handle: Handle) -> list[int]:
        self._do("nvmlDeviceGetEncoderUtilization", handle)
        return [7, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Handle) -> list[int]:
        self._do("nvmlDeviceGetDecoderUtilization", handle)
        return [9, 167000]

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> SimpleNamespace:
        self._do("nvmlDeviceGetMemoryInfo", handle, version)
        if version == pynvml.nvmlMemory_v2:
            return SimpleNamespace(version=version, total=1000, reserved=100, free=300, used=600)
        return SimpleNamespace(total=1000, free=300, used=700)

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        self._do("nvmlDeviceGetTemperature", handle, sensor)
        return {pynvml.NVML_TEMPERATURE_GPU: 55}[sensor]

    def nvmlDeviceGetFieldValues(self, handle: Handle, fieldIds: list[int]) -> list[SimpleNamespace]:
        self._do("nvmlDeviceGetFieldValues", handle, tuple(fieldIds))
        assert fieldIds == [pynvml.NVML_FI_DEV_MEMORY_TEMP]
        value = SimpleNamespace(uiVal=63, dVal=0.0, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0)
        return [
            SimpleNamespace(
                fieldId=fieldIds[0],
                nvmlReturn=pynvml.NVML_SUCCESS,
                valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                value=value,
            )
        ]

    def nvmlDeviceGetPowerUsage(self, handle: Handle) -> int:
        self._do("nvmlDeviceGetPowerUsage", handle)
        return 512250

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        self._do("nvmlDeviceGetTotalEnergyConsumption", handle)
        return 123456789

    def nvmlDeviceGetClockInfo(self, handle: Handle, type: int) -> int:
        self._do("nvmlDeviceGetClockInfo", handle, type)
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        self._do("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return 0x44  # sw power cap (0x04) + hw thermal slowdown (0x40)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Handle) -> int:
        self._do("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return 0x08

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, errorType: int, counterType: int) -> int:
        self._do("nvmlDeviceGetTotalEccErrors", handle, errorType, counterType)
        return {
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 12,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 2,
            (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 1,
            (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
        }[(errorType, counterType)]

    def nvmlDeviceGetPcieReplayCounter(self, handle: Handle) -> int:
        self._do("nvmlDeviceGetPcieReplayCounter", handle)
        return 4

    def nvmlDeviceGetRemappedRows(self, device: Handle) -> tuple[int, int, int, int]:
        self._do("nvmlDeviceGetRemappedRows", device)
        return (5, 1, 0, 1)

    # ---- events
    def nvmlEventSetCreate(self) -> EventSet:
        self._do("nvmlEventSetCreate", None)
        return self.event_set

    def nvmlDeviceGetSupportedEventTypes(self, handle: Handle) -> int:
        self._do("nvmlDeviceGetSupportedEventTypes", handle)
        return self.supported_events[handle.index]

    def nvmlDeviceRegisterEvents(self, handle: Handle, eventTypes: int, eventSet: EventSet) -> None:
        assert isinstance(eventSet, EventSet), "nvmlDeviceRegisterEvents(handle, eventTypes, eventSet)"
        self._do("nvmlDeviceRegisterEvents", handle, eventTypes, eventSet)

    def nvmlEventSetWait_v2(self, eventSet: EventSet, timeoutms: int) -> SimpleNamespace:
        assert isinstance(eventSet, EventSet) and isinstance(timeoutms, int)
        self._do("nvmlEventSetWait_v2", None, eventSet, timeoutms)
        if not self.event_queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        gpu, xid = self.event_queue.pop(0)
        return SimpleNamespace(
            device=self.handles[gpu], eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid, gpuInstanceId=0
        )

    def nvmlEventSetFree(self, eventSet: EventSet) -> None:
        assert isinstance(eventSet, EventSet)
        self._do("nvmlEventSetFree", None, eventSet)


FUNCTIONS = sorted(n for n in vars(RecordingNvml) if n.startswith("nvml"))
