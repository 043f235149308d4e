"""The gpu tier, the XID source and the runtime on the fake NVML: samples and labels, throttle decoding, XIDs on
the bus, lost GPUs, NVML missing, clean shutdown with an XID wait in flight."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from nvdaemon.collectors.base import HostRoots
from nvdaemon.collectors.gpu import decode_throttle
from nvdaemon.gpu import GpuRuntime, GpuStart, open_gpu
from nvdaemon.gpu.events import xid_event, xid_severity
from nvdaemon.gpu.xid import run_xid_source, serve_xid
from nvdaemon.gpu.xid_catalogue import GO_XID_SEVERITY, XID_DESCRIPTIONS
from nvdaemon.model import Event, Kind, Phase, Sample
from nvdaemon.nvml import XID_WAIT_MS, GpuIdentity, NvmlFailure, NvmlUnavailable, XidNotice
from nvdaemon.nvml.fake import CALLS_KEPT, FakeNvml
from tests.gpu.conftest import HEALTHY, THERMAL, XID79, make_agent, open_agent_gpu, wait_until

GAUGES = {
    "gpu_utilization_pct",
    "gpu_mem_copy_util_pct",
    "gpu_encoder_util_pct",
    "gpu_decoder_util_pct",
    "gpu_mem_used_bytes",
    "gpu_mem_free_bytes",
    "gpu_mem_total_bytes",
    "gpu_mem_reserved_bytes",
    "gpu_temperature_celsius",
    "gpu_memory_temperature_celsius",
    "gpu_power_watts",
    "gpu_sm_clock_mhz",
    "gpu_mem_clock_mhz",
    "gpu_throttle_reasons",
    "gpu_row_remap_failed",
    "gpu_throttle_active",
}
COUNTERS = {
    "gpu_energy_joules_total",
    "gpu_ecc_corrected_total",
    "gpu_ecc_uncorrected_total",
    "gpu_pcie_replay_total",
    "gpu_remapped_rows_corrected_total",
    "gpu_remapped_rows_uncorrected_total",
}


def runtime(backend: FakeNvml, events: list[Event] | None = None, wait_ms: int = 1000) -> GpuRuntime:
    sink = events if events is not None else []
    seq = iter(range(1, 1000))
    return GpuRuntime(
        backend, backend.open(), node="n1", emit=sink.extend, next_seq=lambda: next(seq), xid_wait_ms=wait_ms
    )


def tick(rt: GpuRuntime, now: float = 1.0) -> list[Sample]:
    (collector,) = rt.collectors()
    gathered = collector.gather(HostRoots())
    assert gathered.errors == []
    return list(collector.interpret(gathered, now).samples)


def of(samples: list[Sample], device: str, metric: str, **labels: str) -> list[Sample]:
    return [
        s for s in samples if s.device == device and s.metric == metric and labels.items() <= dict(s.labels).items()
    ]


def test_every_sample_and_label_of_a_healthy_8_gpu_node() -> None:
    samples = tick(runtime(FakeNvml(HEALTHY)), now=7.0)
    assert {s.device for s in samples} == {f"gpu{i}" for i in range(8)}
    for s in samples:
        assert s.tier == "gpu" and s.timestamp == 7.0
        assert s.kind is (Kind.COUNTER if s.metric in COUNTERS else Kind.GAUGE), s.metric
    per_device = {m for s in samples if s.device == "gpu3" for m in [s.metric]}
    assert per_device == GAUGES | COUNTERS
    (temp,) = of(samples, "gpu3", "gpu_temperature_celsius")
    assert dict(temp.labels) == {
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpu_uuid": "GPU-3e6f7b54-a085-4c3d-8f4b-8d9e0f1a2b34",
        "pci_bus_id": "00000000:5D:00.0",
    }
    assert temp.value == 43
    assert of(samples, "gpu0", "gpu_power_watts")[0].value == pytest.approx(612.345)
    assert of(samples, "gpu0", "gpu_energy_joules_total")[0].value == pytest.approx(184467440.737)
    assert of(samples, "gpu0", "gpu_mem_total_bytes")[0].value == 85520809984
    assert of(samples, "gpu0", "gpu_mem_reserved_bytes")[0].value == 563085312
    throttles = of(samples, "gpu0", "gpu_throttle_active")
    assert sorted(dict(s.labels)["reason"] for s in throttles) == sorted(
        ["sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"]
    )
    assert all(s.value == 0 for s in throttles)
    assert not of(samples, "gpu0", "gpu_xid_errors_total")


def test_not_supported_readings_have_no_sample() -> None:
    scenario: dict[str, Any] = {
        "devices": [{"uuid": "GPU-x", "name": "T4", "pciBusId": "00000000:01:00.0"}],
        "defaults": {"temperature_gpu": 50, "temperature_memory": None, "remapped_rows_failure": None},
    }
    samples = tick(runtime(FakeNvml(scenario)))
    assert {s.metric for s in samples} == {"gpu_temperature_celsius"}


def test_throttle_decoding() -> None:
    assert decode_throttle(0) == dict.fromkeys(decode_throttle(0), False)
    assert {k for k, v in decode_throttle(0x60).items() if v} == {"sw_thermal_slowdown", "hw_thermal_slowdown"}
    assert {k for k, v in decode_throttle(0x01 | 0x02 | 0x10 | 0x04).items() if v} == {
        "sw_power_cap"
    }  # idle etc. benign
    assert all(decode_throttle(0xFF).values())
    rt = runtime(FakeNvml(THERMAL))
    tick(rt)
    samples = tick(rt)  # tick 1: the throttling starts
    active = {(s.device, dict(s.labels)["reason"]) for s in samples if s.metric == "gpu_throttle_active" and s.value}
    assert active == {("gpu5", "sw_thermal_slowdown"), ("gpu5", "hw_thermal_slowdown"), ("gpu2", "sw_power_cap")}
    assert of(samples, "gpu5", "gpu_throttle_reasons")[0].value == 0x60
    assert of(samples, "gpu5", "gpu_temperature_celsius")[0].value == 88


def test_gpu_lost_is_one_critical_event_per_transition_and_the_tier_keeps_running() -> None:
    events: list[Event] = []
    rt = runtime(FakeNvml(XID79), events)
    tick(rt)
    tick(rt)
    assert events == []  # XIDs go through the XID source, not the tier
    for _ in range(3):
        samples = tick(rt)
        assert not [s for s in samples if s.device == "gpu3"]
        assert len({s.device for s in samples}) == 7
    (lost,) = events
    assert (lost.condition, lost.phase, lost.severity, lost.device) == ("gpu_lost", Phase.ENTER, "critical", "gpu3")
    assert lost.detail["gpu_uuid"] == "GPU-3e6f7b54-a085-4c3d-8f4b-8d9e0f1a2b34"
    assert isinstance(rt.backend, FakeNvml)
    rt.backend.lost.discard(3)  # the GPU answers again (after a reset)
    tick(rt, now=5.0)
    assert [(e.condition, e.phase) for e in events] == [("gpu_lost", Phase.ENTER), ("gpu_lost", Phase.EXIT)]
    assert events[1].ended_at == 5.0 and events[1].started_at == lost.started_at


def test_xid_severity_table_is_the_go_agents() -> None:
    """Contract §3: info 13, 31, 43; warning 63, 74, 92, 94 and unknown codes; critical 48, 64, 79, 95, 119, 120."""
    assert [xid_severity(x) for x in (13, 31, 43)] == ["info"] * 3
    assert [xid_severity(x) for x in (63, 74, 92, 94, 0, 999, 2**31)] == ["warning"] * 7
    assert [xid_severity(x) for x in (48, 64, 79, 95, 119, 120)] == ["critical"] * 6
    # Catalogue codes Go does not list: raised where the GPU needs a reset, never lowered below Go's "warning".
    assert [xid_severity(x) for x in (62, 140)] == ["critical"] * 2
    assert [xid_severity(x) for x in (45, 61)] == ["warning"] * 2
    rank = {"info": 0, "warning": 1, "critical": 2}
    for code in XID_DESCRIPTIONS:
        assert rank[xid_severity(code)] >= rank[GO_XID_SEVERITY.get(code, "warning")], code


def test_xid_events_enter_only_with_the_go_detail_on_the_wire() -> None:
    ident = GpuIdentity(index=2, uuid="GPU-2", pci_bus_id="00000000:3B:00.0")
    for code, severity in ((13, "info"), (74, "warning"), (79, "critical"), (4242, "warning")):
        wire = xid_event(XidNotice(2, code), ident, node="n", seq=1, now=1_700_000_000.5).wire()
        assert (wire["condition"], wire["phase"], wire["severity"]) == ("gpu_xid_error", "ENTER", severity)
        assert wire["started_at"] == "2023-11-14T22:13:20.5Z" and "ended_at" not in wire
        assert wire["detail"]["xid"] == code and isinstance(wire["detail"]["description"], str)


async def test_xid_reaches_the_bus_within_one_wait_and_is_counted(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    rt = await open_agent_gpu(agent)
    # One wait lasts 10 s: an XID that only arrived when the wait timed out would take twice the 5 s allowed, and the
    # 5 s leave room for a machine too busy to run the thread at once.
    rt.xid_wait_ms = 10_000
    fake = rt.backend
    assert isinstance(fake, FakeNvml)
    channel = agent.bus.subscribe("test")
    agent.engine.seq = 41
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_xid, rt)
        await wait_until(lambda: "xid_wait" in fake.calls)
        began = trio.current_time()
        fake.inject_xid(3, 79)
        with trio.fail_after(5):
            ev = await channel.receive()
        assert trio.current_time() - began < 5
        assert (ev.condition, ev.phase, ev.severity, ev.tier, ev.device) == (
            "gpu_xid_error",
            Phase.ENTER,
            "critical",
            "gpu",
            "gpu3",
        )
        assert ev.detail == {
            "xid": 79,
            "description": "GPU has fallen off the bus",
            "gpu_uuid": "GPU-3e6f7b54-a085-4c3d-8f4b-8d9e0f1a2b34",
            "pci_bus_id": "00000000:5D:00.0",
            "sources": ["nvml"],  # the kernel log is not read here (gpu/xid_ledger.py)
        }
        assert ev.seq == 42 == agent.engine.seq
        assert agent.event_counts[("gpu-node", "gpu", "gpu3", "gpu_xid_error", "critical", "ENTER", "79")] == 1
        (counted,) = of(tick(rt), "gpu3", "gpu_xid_errors_total", xid="79")
        assert counted.value == 1 and counted.kind is Kind.COUNTER
        nursery.cancel_scope.cancel()
        fake.inject_xid(3, 13)  # ends the wait in progress, so the cancelled task need not sit out its 10 s
    assert fake.calls[-1] == "xid_close"


async def test_a_gpu_without_xid_support_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    scenario: dict[str, Any] = {"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b", "xidEvents": False}]}
    rt = runtime(FakeNvml(scenario), wait_ms=50)
    caplog.set_level(logging.INFO)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_xid_source, rt)
        nursery.cancel_scope.cancel()
    assert "xid: gpu1: supports no XID events" in caplog.text
    assert "waiting for XID events on 1 GPU(s)" in caplog.text


async def test_empty_xid_waits_stay_in_their_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quiet node: the waits follow one another in one worker thread, not one event-loop trip per wait; a
    cancellation still ends the source within one wait and the event set is freed after it."""
    fake = FakeNvml(HEALTHY)
    rt = runtime(fake, wait_ms=20)
    jobs: list[str] = []
    real_run_sync = trio.to_thread.run_sync

    async def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        jobs.append(getattr(fn, "__name__", repr(fn)))
        return await real_run_sync(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counting)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_xid_source, rt)
        await wait_until(lambda: fake.calls.count("xid_wait_returned") >= 5)
        nursery.cancel_scope.cancel()
    assert [j for j in jobs if j not in ("xid_open", "xid_close")] == ["wait_for_xids"]
    assert fake.calls[-3:] == ["xid_wait", "xid_wait_returned", "xid_close"]


async def test_clean_shutdown_with_a_wait_in_flight(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, extra="shutdownGraceSeconds: 8\n")
    fakes: list[FakeNvml] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        await wait_until(lambda: agent.ready)
        assert agent.gpu is not None and isinstance(agent.gpu.backend, FakeNvml)
        fake = agent.gpu.backend
        fakes.append(fake)
        assert agent.supervisor is not None and "source:xid" in agent.supervisor.tasks
        await wait_until(lambda: fake.calls[-1] == "xid_wait")  # a wait is blocked in its thread right now
        began = trio.current_time()
        agent.stopping.set()
    took = trio.current_time() - began
    # At most the XID wait in flight plus the rest of the shutdown, with room for a loaded machine; short of the
    # grace that a shutdown waiting on anything else would run into.
    assert took < XID_WAIT_MS / 1000 + 2.0
    calls = fakes[0].calls
    assert calls[-4:] == ["xid_wait", "xid_wait_returned", "xid_close", "close"]
    assert agent.gpu is None


async def test_nvml_missing_in_a_mixed_process_skips_the_gpu_tier(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scenario = tmp_path / "missing.json"
    scenario.write_text('{"initError": "NVML Shared Library Not Found", "devices": []}')
    agent = make_agent(tmp_path, tiers="[core, gpu]", scenario=scenario)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        await wait_until(lambda: agent.ready)
        assert agent.active_tiers() == ["core"]
        assert agent.gpu is None and agent.skipped_tiers == {"gpu"}
        assert agent.supervisor is not None and set(agent.supervisor.tasks) >= {"tier:core"}
        assert not [t for t in agent.supervisor.tasks if "gpu" in t or "xid" in t]
        await wait_until(lambda: "core" in agent.snapshots)
        assert agent.health_problems() == []
        agent.stopping.set()
    skipped = [r for r in caplog.records if "skipping gpu tier" in r.getMessage()]
    assert len(skipped) == 1 and "NVML Shared Library Not Found" in skipped[0].getMessage()


async def test_nvml_missing_in_a_gpu_only_process_is_an_error(tmp_path: Path) -> None:
    scenario = tmp_path / "missing.json"
    scenario.write_text('{"initError": "NVML Shared Library Not Found", "devices": []}')
    agent = make_agent(tmp_path, tiers="[gpu]", scenario=scenario)
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        await agent.run()


def test_nvml_that_stops_answering_loses_every_known_gpu_once_and_each_comes_back() -> None:
    events: list[Event] = []
    fake = FakeNvml(HEALTHY)
    rt = runtime(fake, events)
    tick(rt)
    assert [d for d, _, _ in rt.answering()] == [f"gpu{i}" for i in range(8)]
    fake.fail("Driver Not Loaded")
    (collector,) = rt.collectors()
    for now in (2.0, 3.0):
        gathered = collector.gather(HostRoots())
        assert gathered.errors == ["nvmlDeviceGetCount: Driver Not Loaded"]
        assert collector.interpret(gathered, now).samples == ()
    assert [(e.condition, e.phase, e.device) for e in events] == [
        ("gpu_lost", Phase.ENTER, f"gpu{i}") for i in range(8)
    ]
    assert all(e.detail["error"] == "nvmlDeviceGetCount: Driver Not Loaded" for e in events)
    assert events[3].detail["gpu_uuid"] == "GPU-3e6f7b54-a085-4c3d-8f4b-8d9e0f1a2b34"  # the identity last known
    assert rt.answering() == []
    fake.fail("")
    fake.set_lost(6, True)  # back, but one GPU did not survive the driver reload
    tick(rt, now=4.0)
    exits = [e.device for e in events if e.phase is Phase.EXIT]
    assert exits == [f"gpu{i}" for i in range(8) if i != 6]
    assert [d for d, _, _ in rt.answering()] == [f"gpu{i}" for i in range(8) if i != 6]
    assert ("gpu5", "GPU-5a8b9d76-c2a7-4e5f-8b6d-0f1a2b3c4d56", "00000000:AB:00.0") in rt.answering()


def test_nvml_error_in_a_scenario_step() -> None:
    scenario: dict[str, Any] = {
        "devices": [{"uuid": "GPU-a"}],
        "steps": [{}, {"nvmlError": "Unknown Error"}, {"nvmlError": None}],
    }
    fake = FakeNvml(scenario)
    assert fake.device_count() == 1
    with pytest.raises(NvmlFailure, match="Unknown Error"):
        fake.device_count()
    assert fake.device_count() == 1


async def test_open_gpu_takes_the_gpu_slice_and_returns_what_it_opened(tmp_path: Path) -> None:
    """No agent: the config slice, the tiers and two callbacks in; the runtime or the skipped tier out."""
    cfg = make_agent(tmp_path).loaded.config.gpu
    events: list[Event] = []
    seqs = iter(range(7, 100))

    def kw() -> dict[str, Any]:
        return {"node": "n9", "emit": events.extend, "next_seq": lambda: next(seqs)}

    assert await open_gpu(cfg, ["core"], **kw()) == GpuStart(None)  # no gpu tier: NVML is never opened
    start = await open_gpu(cfg, ["core", "gpu"], **kw())
    rt = start.runtime
    assert rt is not None and start.skipped_tiers == frozenset() and rt.node == "n9" and len(rt.identities) == 8
    rt.on_xids([XidNotice(0, 13)], now=1.0)
    assert [(e.node, e.seq, e.detail["xid"]) for e in events] == [("n9", 7, 13)]

    missing = tmp_path / "missing.json"
    missing.write_text('{"initError": "NVML Shared Library Not Found", "devices": []}')
    cfg_missing = make_agent(tmp_path, scenario=missing).loaded.config.gpu
    assert await open_gpu(cfg_missing, ["core", "gpu"], **kw()) == GpuStart(None, frozenset({"gpu"}))
    with pytest.raises(NvmlUnavailable, match="NVML Shared Library Not Found"):
        await open_gpu(cfg_missing, ["gpu"], **kw())


def test_the_call_log_keeps_the_latest_calls_only() -> None:
    """An agent on the fake waits for XIDs every second for as long as it runs: its call log stays bounded."""
    fake = FakeNvml(HEALTHY)
    for _ in range(3 * CALLS_KEPT):
        fake._record("tick")
    fake._record("last")
    assert CALLS_KEPT <= len(fake.calls) <= 2 * CALLS_KEPT and fake.calls[-1] == "last"
