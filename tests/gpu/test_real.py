"""The real backend: through a recording stand-in for pynvml (names, argument order, error handling), and its
NVML-missing path for real on a machine without libnvidia-ml."""

from __future__ import annotations

import ctypes
import inspect
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pynvml  # type: ignore[import-untyped]
import pytest

from nvdaemon.collectors.gpu import THROTTLE_REASONS
from nvdaemon.nvml import GpuIdentity, GpuLost, NvmlFailure, NvmlUnavailable, XidNotice
from nvdaemon.nvml.real import RealNvml
from tests.gpu.recorder import FUNCTIONS, RecordingNvml
from tests.test_e2e import ROOT, free_port
from tests.test_e2e import Agent as Proc


def nvml_installed() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_recorder_signatures_match_pynvml() -> None:
    assert len(FUNCTIONS) >= 25
    for name in FUNCTIONS:
        real = list(inspect.signature(getattr(pynvml, name)).parameters)
        ours = list(inspect.signature(getattr(RecordingNvml, name)).parameters)[1:]  # minus self
        assert ours == real, f"{name}: recorder takes {ours}, pynvml {real}"


def test_throttle_bits_are_nvmls() -> None:
    assert {
        "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
        "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
        "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
        "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    } == THROTTLE_REASONS


def test_open_and_snapshot_make_the_right_calls() -> None:
    lib = RecordingNvml(gpus=2)
    backend = RealNvml(lib)
    ids = backend.open()
    assert ids[1] == GpuIdentity(1, "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA H200", "00000000:19:00.0")
    assert backend.driver_version() == "550.90.07"
    lib.calls.clear()
    snap = backend.snapshot(0)
    assert snap.errors == []
    assert snap.readings == {
        "utilization_gpu": 91,
        "utilization_memory": 33,
        "encoder_util": 7,
        "decoder_util": 9,
        "memory_total": 1000,
        "memory_used": 600,
        "memory_free": 300,
        "memory_reserved": 100,
        "temperature_gpu": 55,
        "temperature_memory": 63,
        "power_usage_mw": 512250,
        "total_energy_mj": 123456789,
        "clock_sm_mhz": 1980,
        "clock_mem_mhz": 2619,
        "throttle_reasons": 0x44,
        "ecc_corrected_aggregate": 12,
        "ecc_uncorrected_aggregate": 2,
        "pcie_replay": 4,
        "remapped_rows_correctable": 5,
        "remapped_rows_uncorrectable": 1,
        "remapped_rows_pending": 0,
        "remapped_rows_failure": 1,
    }
    h0 = lib.handles[0]
    for call in (
        ("nvmlDeviceGetMemoryInfo", h0, pynvml.nvmlMemory_v2),
        ("nvmlDeviceGetTemperature", h0, pynvml.NVML_TEMPERATURE_GPU),
        ("nvmlDeviceGetFieldValues", h0, (pynvml.NVML_FI_DEV_MEMORY_TEMP,)),
        ("nvmlDeviceGetClockInfo", h0, pynvml.NVML_CLOCK_SM),
        ("nvmlDeviceGetClockInfo", h0, pynvml.NVML_CLOCK_MEM),
        ("nvmlDeviceGetTotalEccErrors", h0, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
        ("nvmlDeviceGetTotalEccErrors", h0, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        ("nvmlDeviceGetRemappedRows", h0),
        ("nvmlDeviceGetCurrentClocksEventReasons", h0),
    ):
        assert call in lib.calls, call
    assert all(c[1] is h0 for c in lib.calls), "every call of snapshot(0) is about GPU 0"
    backend.close()
    assert lib.calls[-1] == ("nvmlShutdown",)


def test_not_supported_omits_old_driver_falls_back_other_errors_are_listed() -> None:
    lib = RecordingNvml(gpus=1)
    backend = RealNvml(lib)
    backend.open()
    errs = lib.errors[0]
    errs["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    errs["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    errs["nvmlDeviceGetPcieReplayCounter"] = pynvml.NVML_ERROR_UNKNOWN
    snap = backend.snapshot(0)
    assert "power_usage_mw" not in snap.readings
    assert snap.readings["throttle_reasons"] == 0x08  # from nvmlDeviceGetCurrentClocksThrottleReasons
    assert "pcie_replay" not in snap.readings
    assert len(snap.errors) == 1 and snap.errors[0].startswith("gpu0 pcie replay: ")
    assert snap.readings["temperature_gpu"] == 55  # the rest is kept


def test_gpu_is_lost_raises_gpu_lost() -> None:
    lib = RecordingNvml(gpus=2)
    backend = RealNvml(lib)
    backend.open()
    lib.errors[1]["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert backend.snapshot(0).readings
    with pytest.raises(GpuLost, match="gpu1"):
        backend.snapshot(1)


def test_a_gpu_lost_before_open_is_warned_about_once_not_every_tick(caplog: pytest.LogCaptureFixture) -> None:
    lib = RecordingNvml(gpus=2)
    for call in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo", "nvmlDeviceGetUtilizationRates"):
        lib.errors[1][call] = pynvml.NVML_ERROR_GPU_IS_LOST
    backend = RealNvml(lib)
    with caplog.at_level(logging.WARNING, logger="nvdaemon.nvml.real"):
        assert backend.open()[1].uuid == ""
        for _ in range(5):  # five gpu ticks
            with pytest.raises(GpuLost):
                backend.snapshot(1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sorted(w.split(" unknown")[0] for w in warnings) == ["gpu1: name", "gpu1: pci_bus_id", "gpu1: uuid"]
    assert [c for c in lib.calls if c[0] == "nvmlDeviceGetUUID" and c[1] is lib.handles[1]][5:]  # still asked


def test_xid_registration_is_masked_by_supported_types_then_wait_and_free() -> None:
    lib = RecordingNvml(gpus=2)
    lib.supported_events[1] = pynvml.nvmlEventTypeSingleBitEccError
    backend = RealNvml(lib)
    backend.open()
    problems = backend.xid_open()
    assert problems == ["gpu1: supports no XID events"]
    assert backend.xid_registered() == 1
    es = lib.event_set
    register = [c for c in lib.calls if c[0] == "nvmlDeviceRegisterEvents"]
    assert register == [("nvmlDeviceRegisterEvents", lib.handles[0], pynvml.nvmlEventTypeXidCriticalError, es)]
    assert backend.xid_wait(1000) == []  # NVML_ERROR_TIMEOUT is not an error
    assert lib.calls[-1] == ("nvmlEventSetWait_v2", es, 1000)
    lib.event_queue.append((0, 79))
    assert backend.xid_wait(1000) == [XidNotice(0, 79)]
    assert ("nvmlDeviceGetIndex", lib.handles[0]) in lib.calls  # the notice's GPU is NVML's index of the handle
    backend.xid_close()
    assert lib.calls[-1:] == [("nvmlEventSetFree", es)]
    assert backend.xid_registered() == 0
    with pytest.raises(NvmlFailure, match="without an event set"):
        backend.xid_wait(1000)  # freed: a wait after close is an error, never a call on a freed set
    assert [c for c in lib.calls if c[0] == "nvmlEventSetWait_v2"] == [("nvmlEventSetWait_v2", es, 1000)] * 2


def test_nvml_init_failure_is_unavailable() -> None:
    lib = RecordingNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        RealNvml(lib).open()


needs_no_nvml = pytest.mark.skipif(
    nvml_installed(), reason="libnvidia-ml is installed: the missing path is not real here"
)


@needs_no_nvml
def test_real_pynvml_without_the_library() -> None:
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        RealNvml().open()


CONFIG = """
node: fixture-node
tiers: {tiers}
intervalSeconds: 0.3
stateDir: {state}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
"""


@pytest.mark.e2e
@needs_no_nvml
def test_real_nvml_missing_mixed_process_keeps_core_gpu_only_process_exits_1(tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "healthy", host, symlinks=True)
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(CONFIG.format(tiers="[core, gpu]", state=tmp_path / "s1", port=free_port()))
    agent = Proc(tmp_path, host, mixed)
    try:
        agent.start()
        assert "load1" in {s["metric"] for s in agent.samples()}
        assert agent.get("/healthz")[0] == 200
        assert agent.stop()[0] == 0
    finally:
        agent.kill()
    log = (tmp_path / "agent.log").read_text()
    assert log.count("skipping gpu tier") == 1 and "NVML Shared Library Not Found" in log

    only = tmp_path / "only.yaml"
    only.write_text(CONFIG.format(tiers="[gpu]", state=tmp_path / "s2", port=free_port()))
    cmd = [sys.executable, "-m", "nvdaemon", "run", "--host-root", str(host), "--config", str(only)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT, check=False)
    assert done.returncode == 1
    assert "gpu tier: nvmlInit: NVML Shared Library Not Found" in done.stderr
