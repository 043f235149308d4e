"""The default GPU rules of examples/gpu.yaml fire on the recorded scenarios, through the real engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nvdaemon import engine
from nvdaemon.collectors.base import HostRoots
from nvdaemon.configload import load_config
from nvdaemon.gpu import GpuRuntime
from nvdaemon.model import Event, new_event_id
from nvdaemon.nvml.fake import FakeNvml
from tests.gpu.conftest import ROOT, THERMAL

EXAMPLE = ROOT / "examples" / "gpu.yaml"


def run(scenario: dict[str, Any] | Path, ticks: int) -> list[tuple[int, str, str, str, str]]:
    """(tick, condition, device, phase, severity) of every event over ``ticks`` ticks."""
    loaded = load_config(str(EXAMPLE), env={})
    rules = engine.compile_rules(loaded.config.rules)
    state = engine.EngineState()
    backend = FakeNvml(scenario)
    rt = GpuRuntime(backend, backend.open(), node="n")
    (collector,) = rt.collectors()
    out = []
    for t in range(ticks):
        samples = collector.interpret(collector.gather(HostRoots()), float(t * 15)).samples
        events: list[Event] = engine.evaluate(
            state, rules, samples, tier="gpu", node="n", now=float(t * 15), new_id=new_event_id
        )
        out += [(t, e.condition, e.device, e.phase.value, e.severity) for e in events]
    return out


def test_example_loads_with_the_four_rules() -> None:
    loaded = load_config(str(EXAMPLE), env={})
    assert loaded.tiers == ("core", "gpu")
    assert [r.condition for r in loaded.config.rules] == [
        "gpu_hot",
        "gpu_ecc_uncorrected",
        "gpu_row_remap_failed",
        "gpu_throttled",
    ]


def test_thermal_scenario_hot_after_3_ticks_throttled_after_5() -> None:
    events = run(THERMAL, 7)
    enters = {(t, c, d) for t, c, d, p, _ in events if p == "ENTER"}
    # throttling starts on tick 1: hot (3/3) enters on tick 3, throttled (5 ticks) on tick 5, per reason
    assert enters == {(3, "gpu_hot", "gpu5"), (5, "gpu_throttled", "gpu5"), (5, "gpu_throttled", "gpu2")}
    assert events.count((5, "gpu_throttled", "gpu5", "ENTER", "warning")) == 2  # one series per reason
    assert (3, "gpu_hot", "gpu5", "ENTER", "warning") in events


def test_uncorrected_ecc_increase_and_row_remap_failure_are_critical() -> None:
    scenario: dict[str, Any] = {
        "devices": [{"uuid": "GPU-a", "name": "H200", "pciBusId": "00000000:01:00.0"}],
        "defaults": {"ecc_uncorrected_aggregate": 3, "remapped_rows_failure": 0},
        "steps": [
            {},
            {},
            {"readings": {"0": {"ecc_uncorrected_aggregate": 4}}},
            {"readings": {"0": {"remapped_rows_failure": 1}}},
        ],
    }
    events = run(scenario, 4)
    assert (2, "gpu_ecc_uncorrected", "gpu0", "ENTER", "critical") in events
    assert (3, "gpu_row_remap_failed", "gpu0", "ENTER", "critical") in events
    assert not [e for e in events if e[0] < 2]
