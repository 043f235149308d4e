"""What kernel-log matches become (nvdaemon/kmsg/faults.py): event rules fold repeats within their window, condition
rules ENTER after ``count`` matches within the window and EXIT after ``clearAfterSeconds`` of quiet, SXIDs and
fallen-off GPUs are conditions, a GPU brought up again or a reboot EXITs them. Time is passed in; every event's
seq comes from the engine state, one per event."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec
import pytest

from nvdaemon.config import KernelRule
from nvdaemon.engine import ActiveCondition, EngineState
from nvdaemon.gpu.xid_ledger import pci_key
from nvdaemon.kmsg.faults import FALLEN_CONDITION, SXID_CONDITION, KernelFaults
from nvdaemon.kmsg.gpu_lines import GpuLine, parse_gpu_line
from nvdaemon.kmsg.rules import KEY_PREFIX, CompiledKernelRule, compile_rule
from nvdaemon.model import Event, Phase

NODE = "node-a"
T0 = 1_733_140_000.0


class Ids:
    """A deterministic ``new_id``: ``id-1``, ``id-2``, ..."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, now: float) -> str:
        self.n += 1
        return f"id-{self.n}"


def kernel_rule(**overrides: object) -> CompiledKernelRule:
    raw: dict[str, object] = {"pattern": r"disk (?P<dev>\w+) failed", "condition": "disk_failed", "device": "dev"}
    raw.update(overrides)
    return compile_rule(msgspec.convert(raw, KernelRule))


def faults() -> KernelFaults:
    return KernelFaults(NODE, new_id=Ids())


def rules_of(*crs: CompiledKernelRule) -> Mapping[str, CompiledKernelRule]:
    return {cr.key: cr for cr in crs}


def match(kf: KernelFaults, state: EngineState, cr: CompiledKernelRule, device: str, at: float) -> list[Event]:
    return kf.on_rule(state, cr, device, {"dev": device, "unused": None}, f"disk {device} failed", T0 + at)


def assert_seqs_consecutive(events: Iterable[Event], start: int = 1) -> None:
    assert [e.seq for e in events] == list(range(start, start + len(list(events))))


# ---- event mode ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        # (match times, [(time, repeats)] of the events they raise); window 60 s, measured from the last event
        ([0], [(0, 0)]),
        ([0, 10, 20, 30], [(0, 0)]),
        ([0, 10, 20, 30, 60], [(0, 0), (60, 3)]),
        ([0, 59.9, 60], [(0, 0), (60, 1)]),
        ([0, 100, 200], [(0, 0), (100, 0), (200, 0)]),
        ([0, 30, 61, 90, 121, 200], [(0, 0), (61, 1), (121, 1), (200, 0)]),
    ],
)
def test_event_mode_folds_repeats_within_the_window(times: list[float], expected: list[tuple[float, int]]) -> None:
    kf, state, cr = faults(), EngineState(), kernel_rule(windowSeconds=60)
    events = [e for t in times for e in match(kf, state, cr, "sda", t)]
    assert [(e.started_at - T0, e.detail["repeats"]) for e in events] == expected
    assert all(e.phase is Phase.ENTER and e.condition == "disk_failed" and e.device == "sda" for e in events)
    assert all(e.tier == "kernel" and e.node == NODE for e in events)
    assert_seqs_consecutive(events)
    assert state.active == {}  # events are not conditions


def test_event_mode_folds_per_device() -> None:
    kf, state, cr = faults(), EngineState(), kernel_rule(windowSeconds=60)
    events = [*match(kf, state, cr, "sda", 0), *match(kf, state, cr, "sdb", 1), *match(kf, state, cr, "sda", 2)]
    assert [e.device for e in events] == ["sda", "sdb"]


def test_event_detail_carries_the_line_and_named_groups() -> None:
    kf, state, cr = faults(), EngineState(), kernel_rule(severity="critical")
    (ev,) = kf.on_rule(state, cr, "sda", {"dev": "sda", "pid": "x" * 500, "none": None}, "m" * 2000, T0)
    assert ev.severity == "critical"
    assert ev.detail["message"] == "m" * 512
    assert ev.detail["dev"] == "sda"
    assert ev.detail["pid"] == "x" * 128
    assert "none" not in ev.detail


# ---- condition mode ------------------------------------------------------------------------------------------------

COND = {"mode": "condition", "count": 3, "windowSeconds": 600, "clearAfterSeconds": 1800}


@pytest.mark.parametrize(
    ("times", "enter_at"),
    [
        ([0, 100, 200], 200),
        ([0, 599, 599.5], 599.5),
        ([0, 300, 650, 700], 700),  # 0 is out of the window at 650; 300, 650, 700 are within
        ([0, 700, 1400, 2100, 2800], None),  # spaced wider than the window: never
        ([0, 599.9, 1199.8, 1799.7], None),  # each within the window of the one before, never three
        ([0, 100], None),
    ],
)
def test_condition_enters_after_count_matches_in_the_window(times: list[float], enter_at: float | None) -> None:
    kf, state, cr = faults(), EngineState(), kernel_rule(**COND)
    events = [(t, e) for t in times for e in match(kf, state, cr, "sda", t)]
    if enter_at is None:
        assert events == []
        assert state.active == {}
        return
    assert [(t, e.phase) for t, e in events] == [(enter_at, Phase.ENTER)]
    (ev,) = [e for _, e in events]
    assert (ev.condition, ev.device, ev.detail["threshold"], ev.detail["metric"]) == ("disk_failed", "sda", 3.0, "kmsg")
    assert list(state.active) == [(cr.key, "kmsg", "sda", ())]


def test_condition_stays_one_under_many_matches_then_exits_when_quiet() -> None:
    kf, state, cr = faults(), EngineState(), kernel_rule(**COND)
    rules = rules_of(cr)
    events = [e for t in range(0, 1000, 10) for e in match(kf, state, cr, "sda", t)]
    assert [e.phase for e in events] == [Phase.ENTER]
    (cond,) = state.active.values()
    assert cond.last_seen == T0 + 990
    assert KernelFaults.next_deadline(state, rules) == T0 + 990 + 1800
    assert kf.due(state, rules, T0 + 990 + 1799) == []
    (exit_ev,) = kf.due(state, rules, T0 + 990 + 1800)
    assert (exit_ev.phase, exit_ev.detail["reason"], exit_ev.ended_at) == (Phase.EXIT, "quiet", T0 + 2790)
    assert exit_ev.started_at == events[0].started_at
    assert state.active == {}
    assert KernelFaults.next_deadline(state, rules) is None
    assert_seqs_consecutive([*events, exit_ev])


def test_due_exits_only_conditions_of_the_rules_given() -> None:
    kf, state = faults(), EngineState()
    quick, slow = (
        kernel_rule(**{**COND, "count": 1, "clearAfterSeconds": 60}),
        kernel_rule(**{**COND, "count": 1, "condition": "disk_slow"}),
    )
    match(kf, state, quick, "sda", 0)
    match(kf, state, slow, "sda", 0)
    kf.on_sxid(state, sxid_line(), "sxid", T0)
    exits = kf.due(state, rules_of(quick, slow), T0 + 100)
    assert [(e.condition, e.phase) for e in exits] == [("disk_failed", Phase.EXIT)]
    assert {c.condition for c in state.active.values()} == {"disk_slow", SXID_CONDITION}
    assert KernelFaults.next_deadline(state, rules_of(quick, slow)) == T0 + 1800


# ---- SXIDs and fallen-off GPUs -------------------------------------------------------------------------------------


def sxid_line(switch: int = 0, sxid: int = 24007, fatal: bool = True) -> GpuLine:
    sev = "Fatal" if fatal else "Non-fatal"
    line = parse_gpu_line(f"nvidia-nvswitch{switch}: SXid (PCI:0000:c3:00.0): {sxid}, {sev}, Link 30 sourcetrack")
    assert line is not None
    return line


@pytest.mark.parametrize(
    ("lines", "entered"),
    [
        ([(0, 24007, True)], [("nvswitch0", "24007", "critical")]),
        ([(0, 20009, False)], [("nvswitch0", "20009", "warning")]),
        ([(0, 24007, True)] * 5, [("nvswitch0", "24007", "critical")]),
        (
            [(0, 24007, True), (0, 20009, False), (1, 24007, True), (0, 24007, True)],
            [("nvswitch0", "24007", "critical"), ("nvswitch0", "20009", "warning"), ("nvswitch1", "24007", "critical")],
        ),
    ],
)
def test_sxid_is_one_condition_per_switch_and_sxid(
    lines: list[tuple[int, int, bool]], entered: list[tuple[str, str, str]]
) -> None:
    kf, state = faults(), EngineState()
    events = [
        e
        for i, (sw, code, fatal) in enumerate(lines)
        for e in kf.on_sxid(state, sxid_line(sw, code, fatal), "m", T0 + i)
    ]
    assert [(e.device, e.detail["sxid"], e.severity) for e in events] == entered
    assert all(e.condition == SXID_CONDITION and e.phase is Phase.ENTER for e in events)
    assert len(state.active) == len(entered)
    assert_seqs_consecutive(events)


def test_sxid_detail() -> None:
    kf, state = faults(), EngineState()
    (ev,) = kf.on_sxid(state, sxid_line(), "the line", T0)
    assert {k: ev.detail[k] for k in ("sxid", "pci_bus_id", "fatal", "link", "description", "message")} == {
        "sxid": "24007",
        "pci_bus_id": "0000:c3:00.0",
        "fatal": "true",
        "link": "30",
        "description": "sourcetrack",
        "message": "the line",
    }


def test_fallen_off_exits_when_the_gpu_is_up_again() -> None:
    kf, state = faults(), EngineState()
    entered = kf.on_fallen_off(state, "0000:b3:00.0", "NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.", T0)
    assert [(e.condition, e.device, e.severity, e.phase) for e in entered] == [
        (FALLEN_CONDITION, "0000:b3:00.0", "critical", Phase.ENTER)
    ]
    assert kf.on_fallen_off(state, "0000:b3:00.0", "again", T0 + 1) == []  # one condition per GPU
    other = kf.on_fallen_off(state, "0000:18:00.0", "another GPU", T0 + 2)
    assert kf.on_gpu_up(state, pci_key, "0000:3b:00", T0 + 3) == []  # a GPU that did not fall off
    (exit_ev,) = kf.on_gpu_up(state, pci_key, "0000:B3:00", T0 + 10)  # the kernel's form of the same address
    assert (exit_ev.phase, exit_ev.device, exit_ev.detail["reason"]) == (Phase.EXIT, "0000:b3:00.0", "gpu_initialised")
    assert [c.device for c in state.active.values()] == ["0000:18:00.0"]
    assert_seqs_consecutive([*entered, *other, exit_ev])


# ---- reboots -------------------------------------------------------------------------------------------------------


def engine_condition() -> ActiveCondition:
    """A threshold rule's condition (the engine's, not the kernel log's)."""
    return ActiveCondition(
        rule_key="0123456789abcdef",
        metric="load1",
        device="cpu",
        labels=(),
        condition="load_high",
        severity="warning",
        tier="core",
        threshold=8.0,
        started_at=T0,
        enter_id="id-0",
        value=9.0,
        last_seen=T0,
    )


def test_reboot_exits_every_kernel_log_condition_and_nothing_else() -> None:
    kf, state = faults(), EngineState(seq=41)
    other_key = ("0123456789abcdef", "load1", "cpu", ())
    state.active[other_key] = engine_condition()
    cr = kernel_rule(**{**COND, "count": 1})
    entered = [
        *match(kf, state, cr, "sda", 0),
        *kf.on_sxid(state, sxid_line(), "m", T0),
        *kf.on_fallen_off(state, "0000:b3:00.0", "m", T0),
        *match(kf, state, kernel_rule(windowSeconds=60), "sdb", 0),  # an event: nothing to EXIT
    ]
    exits = kf.reboot(state, T0 + 100)
    assert sorted((e.condition, e.phase, e.detail["reason"]) for e in exits) == [
        ("disk_failed", Phase.EXIT, "reboot"),
        (FALLEN_CONDITION, Phase.EXIT, "reboot"),
        (SXID_CONDITION, Phase.EXIT, "reboot"),
    ]
    assert list(state.active) == [other_key]
    assert cr.key.startswith(KEY_PREFIX)
    assert_seqs_consecutive([*entered, *exits], start=42)
    assert kf.memory == {}
    # the memory went with the boot: the next match of the event rule is an event again
    assert len(match(kf, state, kernel_rule(windowSeconds=60), "sdb", 101)) == 1
