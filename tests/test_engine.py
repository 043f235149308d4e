"""The rule engine: hysteresis, ops, rate rules, per-series state, matching, events, staleness, retirement and
restart persistence. Pure functions, so every test drives ``evaluate`` directly with tables of samples."""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvdaemon.config import Rule
from nvdaemon.engine import (
    SERIES_FORGET_SECONDS,
    CompiledRule,
    EngineState,
    compile_rules,
    dump_state,
    evaluate,
    load_state,
    retire_rules,
    rule_key,
)
from nvdaemon.model import Event, Phase, Sample, make_labels, new_event_id

NODE = "node-a"
T0 = 1_733_140_000.0
STEP = 15.0
HI = 20.0  # breaches the default rule (> 10)
LO = 5.0  # clear for the default rule


class Ids:
    """A deterministic ``new_id``: ``id-1``, ``id-2``, … and the times it was asked for."""

    def __init__(self) -> None:
        self.calls: list[float] = []

    def __call__(self, now: float) -> str:
        self.calls.append(now)
        return f"id-{len(self.calls)}"


def rule(**overrides: object) -> Rule:
    """A rule converted the way the config loader does it (so floats are floats and defaults are filled in)."""
    raw: dict[str, object] = {"metric": "m", "condition": "c_high", "threshold": 10.0}
    raw.update(overrides)
    return msgspec.convert(raw, Rule)


def sample(
    value: float,
    device: str = "d0",
    metric: str = "m",
    labels: dict[str, str] | None = None,
    timestamp: float = 0.0,
    tier: str = "core",
) -> Sample:
    return Sample(metric=metric, device=device, value=value, labels=make_labels(labels), tier=tier, timestamp=timestamp)


def tick_time(i: int) -> float:
    return T0 + i * STEP


class Engine:
    """One EngineState driven tick by tick, remembering every event with the tick it came from."""

    def __init__(self, rules: Sequence[Rule], state: EngineState | None = None) -> None:
        self.rules: dict[str, list[CompiledRule]] = compile_rules(rules)
        self.state = state if state is not None else EngineState()
        self.ids = Ids()
        self.tick = 0
        self.log: list[tuple[int, Event]] = []

    def step(self, samples: Sequence[Sample], tier: str = "core") -> list[Event]:
        events = evaluate(
            self.state,
            self.rules,
            samples,
            tier=tier,
            node=NODE,
            now=tick_time(self.tick),
            new_id=self.ids,
        )
        self.log.extend((self.tick, ev) for ev in events)
        self.tick += 1
        return events

    def transitions(self) -> list[tuple[int, Phase]]:
        return [(i, ev.phase) for i, ev in self.log]


E, X = Phase.ENTER, Phase.EXIT


# --- hysteresis ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("enter_for", "exit_for", "values", "expected"),
    [
        pytest.param(1, 1, [HI, LO, HI, LO], [(0, E), (1, X), (2, E), (3, X)], id="immediate-both-ways"),
        pytest.param(1, 1, [HI, HI, HI, HI], [(0, E)], id="no-second-enter-while-active"),
        pytest.param(3, 1, [HI, HI, LO, HI, HI, HI], [(5, E)], id="enterFor3-clear-resets-breach-streak"),
        pytest.param(3, 1, [HI, HI], [], id="enterFor3-two-breaches-not-enough"),
        pytest.param(1, 2, [HI, LO, HI, LO, LO], [(0, E), (4, X)], id="exitFor2-breach-resets-clear-streak"),
        pytest.param(1, 2, [HI, LO, LO], [(0, E), (2, X)], id="exitFor2-exit-after-two-clear"),
        pytest.param(1, 2, [HI, LO], [(0, E)], id="exitFor2-one-clear-not-enough"),
        pytest.param(2, 1, [HI, HI, LO, HI, LO, HI, HI], [(1, E), (2, X), (6, E)], id="re-enter-needs-fresh-streak"),
        pytest.param(2, 3, [HI, HI, LO, LO, HI, LO, LO, LO], [(1, E), (7, X)], id="enterFor2-exitFor3"),
    ],
)
def test_hysteresis(enter_for: int, exit_for: int, values: list[float], expected: list[tuple[int, Phase]]) -> None:
    eng = Engine([rule(enterFor=enter_for, exitFor=exit_for)])
    for v in values:
        eng.step([sample(v)])
    assert eng.transitions() == expected


# --- ops ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "value", "breaching"),
    [
        (">", 10.5, True),
        (">", 10.0, False),
        (">", 9.5, False),
        (">=", 10.5, True),
        (">=", 10.0, True),
        (">=", 9.5, False),
        ("<", 9.5, True),
        ("<", 10.0, False),
        ("<", 10.5, False),
        ("<=", 9.5, True),
        ("<=", 10.0, True),
        ("<=", 10.5, False),
    ],
)
def test_ops_at_and_around_the_threshold(op: str, value: float, breaching: bool) -> None:
    eng = Engine([rule(op=op, threshold=10.0)])
    events = eng.step([sample(value)])
    assert [ev.phase for ev in events] == ([E] if breaching else [])


def test_default_op_is_greater_than() -> None:
    eng = Engine([rule(threshold=10.0)])
    assert eng.step([sample(10.0)]) == []
    assert [ev.phase for ev in eng.step([sample(10.1)])] == [E]


def test_nan_value_is_not_evaluated() -> None:
    eng = Engine([rule(op="<", enterFor=1)])
    assert eng.step([sample(math.nan)]) == []
    assert eng.state.active == {}


# --- rate rules ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "threshold", "enter_for", "points", "expected"),
    [
        # per-second increase: 30 over 15 s is 2/s
        pytest.param(">", 1.5, 1, [(0.0, 0.0), (15.0, 30.0)], [(1, E, 2.0)], id="per-second-increase"),
        pytest.param(">", 2.5, 1, [(0.0, 0.0), (15.0, 30.0)], [], id="per-second-increase-below"),
        # the first sample of a counter has no rate, however big the raw value is
        pytest.param(">", 5.0, 1, [(0.0, 1e9)], [], id="first-sample-no-evaluation"),
        pytest.param(">", 5.0, 2, [(0.0, 1e9), (10.0, 1e9 + 100)], [], id="first-sample-no-breach-counted"),
        # a counter reset: 1000 -> 30 counts as an increase of 30 (3/s), not -97/s
        pytest.param(
            ">", 2.5, 1, [(0.0, 1000.0), (10.0, 1010.0), (20.0, 30.0)], [(2, E, 3.0)], id="counter-reset-increase"
        ),
        pytest.param("<", 0.0, 1, [(0.0, 1000.0), (10.0, 30.0)], [], id="counter-reset-never-negative"),
        # equal timestamps: no evaluation (no division by zero, no breach counted)
        pytest.param(">", 5.0, 1, [(0.0, 0.0), (0.0, 100.0)], [], id="equal-timestamps"),
        pytest.param(
            ">", 5.0, 2, [(0.0, 0.0), (10.0, 100.0), (10.0, 200.0), (20.0, 300.0)], [(3, E, 10.0)], id="equal-ts-skip"
        ),
    ],
)
def test_rate_rules(
    op: str,
    threshold: float,
    enter_for: int,
    points: list[tuple[float, float]],
    expected: list[tuple[int, Phase, float]],
) -> None:
    eng = Engine([rule(rate=True, op=op, threshold=threshold, enterFor=enter_for)])
    for ts, v in points:
        eng.step([sample(v, timestamp=T0 + ts)])
    got = [(i, ev.phase, ev.detail["value"]) for i, ev in eng.log]
    assert got == expected


def test_rate_rule_exits_when_the_counter_stops_increasing() -> None:
    eng = Engine([rule(rate=True, threshold=0.0)])
    for ts, v in [(0.0, 5.0), (10.0, 7.0), (20.0, 7.0)]:
        eng.step([sample(v, timestamp=T0 + ts)])
    assert eng.transitions() == [(1, E), (2, X)]
    assert eng.log[1][1].detail["value"] == 0.0


# --- state per full series ----------------------------------------------------------------------------------------


def test_state_is_per_full_series_labels_included() -> None:
    eng = Engine([rule(metric="psi", enterFor=2)])

    def psi(some: float, full: float) -> list[Sample]:
        return [
            sample(some, device="memory", metric="psi", labels={"kind": "some"}),
            sample(full, device="memory", metric="psi", labels={"kind": "full"}),
        ]

    assert eng.step(psi(HI, LO)) == []
    first = eng.step(psi(HI, HI))
    assert [(ev.phase, ev.detail["labels"]) for ev in first] == [(E, {"kind": "some"})]
    second = eng.step(psi(LO, HI))
    # "some" clears (exitFor=1) while "full" reaches its own enterFor: each series keeps its own streaks
    assert sorted((ev.phase.value, str(ev.detail["labels"])) for ev in second) == [
        ("ENTER", "{'kind': 'full'}"),
        ("EXIT", "{'kind': 'some'}"),
    ]
    assert [c.labels for c in eng.state.active.values()] == [(("kind", "full"),)]


# --- matching -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule_device", "sample_device", "matches"),
    [
        ("nvme*", "nvme0n1", True),
        ("nvme*", "sda", False),
        ("sd?", "sda", True),
        ("sd?", "sda1", False),
        ("sd[ab]", "sdb", True),
        ("sd[ab]", "sdc", False),
        ("NVME*", "nvme0n1", False),  # case-sensitive
        ("sda", "sda", True),
        ("sda", "sdb", False),
        ("sda", "sda1", False),  # exact, not prefix
        ("", "anything", True),
        ("", "", True),
    ],
)
def test_device_matching(rule_device: str, sample_device: str, matches: bool) -> None:
    eng = Engine([rule(device=rule_device)])
    events = eng.step([sample(HI, device=sample_device)])
    assert [ev.device for ev in events] == ([sample_device] if matches else [])


def test_empty_device_tracks_every_device_on_its_own() -> None:
    eng = Engine([rule(enterFor=2)])
    eng.step([sample(HI, device="a"), sample(LO, device="b")])
    events = eng.step([sample(HI, device="a"), sample(HI, device="b")])
    assert [ev.device for ev in events] == ["a"]
    events = eng.step([sample(HI, device="a"), sample(HI, device="b")])
    assert [ev.device for ev in events] == ["b"]


def test_other_metrics_are_ignored() -> None:
    eng = Engine([rule(metric="m")])
    assert eng.step([sample(HI, metric="other")]) == []
    assert eng.state.series == {}


@pytest.mark.parametrize(
    ("rule_labels", "sample_labels", "matches"),
    [
        ({}, {}, True),
        ({}, {"kind": "some"}, True),
        ({"kind": "some"}, {"kind": "some"}, True),
        ({"kind": "some"}, {"kind": "some", "resource": "memory"}, True),
        ({"kind": "some"}, {"kind": "full", "resource": "memory"}, False),
        ({"kind": "some"}, {}, False),
        ({"kind": "some", "resource": "io"}, {"kind": "some", "resource": "memory"}, False),
        ({"kind": "some", "resource": "io"}, {"kind": "some"}, False),
    ],
)
def test_label_subset_matching(rule_labels: dict[str, str], sample_labels: dict[str, str], matches: bool) -> None:
    eng = Engine([rule(labels=rule_labels)])
    events = eng.step([sample(HI, labels=sample_labels)])
    assert len(events) == (1 if matches else 0)


# --- event fields -------------------------------------------------------------------------------------------------


def test_event_fields_enter_and_exit() -> None:
    eng = Engine([rule(metric="temp_celsius", condition="temp_high", severity="critical", threshold=90.0, op=">=")])
    (enter,) = eng.step([sample(95.0, device="cpu0", metric="temp_celsius", labels={"sensor": "pkg"})], tier="smart")
    eng.step([sample(96.0, device="cpu0", metric="temp_celsius", labels={"sensor": "pkg"})], tier="smart")
    (exit_,) = eng.step([sample(80.0, device="cpu0", metric="temp_celsius", labels={"sensor": "pkg"})], tier="smart")

    assert enter.phase is Phase.ENTER
    assert (enter.id, enter.node, enter.tier, enter.device) == ("id-1", NODE, "smart", "cpu0")
    assert (enter.condition, enter.severity, enter.seq) == ("temp_high", "critical", 1)
    assert enter.started_at == tick_time(0)
    assert enter.ended_at is None
    assert enter.detail == {"value": 95.0, "threshold": 90.0, "metric": "temp_celsius", "labels": {"sensor": "pkg"}}

    assert exit_.phase is Phase.EXIT
    assert (exit_.id, exit_.node, exit_.tier, exit_.device) == ("id-2", NODE, "smart", "cpu0")
    assert (exit_.condition, exit_.severity, exit_.seq) == ("temp_high", "critical", 2)
    assert exit_.started_at == tick_time(0)  # carried over from the ENTER
    assert exit_.ended_at == tick_time(2)
    assert exit_.detail == {"value": 80.0, "threshold": 90.0, "metric": "temp_celsius", "labels": {"sensor": "pkg"}}
    assert eng.ids.calls == [tick_time(0), tick_time(2)]


def test_seq_increases_by_one_per_event_across_tiers() -> None:
    eng = Engine([rule(metric="a"), rule(metric="b")])
    seqs: list[int] = []
    for v in (HI, LO, HI):
        seqs += [ev.seq for ev in eng.step([sample(v, metric="a")], tier="core")]
        seqs += [ev.seq for ev in eng.step([sample(v, metric="b", device="gpu0")], tier="gpu")]
    assert seqs == [1, 2, 3, 4, 5, 6]
    assert eng.state.seq == 6
    assert [ev.tier for _, ev in eng.log] == ["core", "gpu"] * 3


def test_real_event_ids_are_unique() -> None:
    state = EngineState()
    rules = compile_rules([rule()])
    ids = []
    for i, v in enumerate([HI, LO] * 5):
        events = evaluate(state, rules, [sample(v)], tier="core", node=NODE, now=T0 + i, new_id=new_event_id)
        ids += [ev.id for ev in events]
    assert len(ids) == 10
    assert len(set(ids)) == 10


# --- staleness ----------------------------------------------------------------------------------------------------


def test_vanished_series_is_stale_not_exited_and_recovers() -> None:
    eng = Engine([rule()])
    eng.step([sample(HI, device="a"), sample(HI, device="b")])
    ((key_a, cond_a),) = [(k, c) for k, c in eng.state.active.items() if c.device == "a"]
    for _ in range(5):
        assert eng.step([sample(HI, device="b")]) == []  # "a" vanished
    assert key_a in eng.state.active
    assert cond_a.stale is True
    assert all(not c.stale for c in eng.state.active.values() if c.device == "b")
    assert eng.step([sample(HI, device="a"), sample(HI, device="b")]) == []
    assert cond_a.stale is False
    # and once back it can EXIT normally
    assert [(ev.phase, ev.device) for ev in eng.step([sample(LO, device="a")])] == [(X, "a")]


def test_other_tiers_evaluation_does_not_mark_stale() -> None:
    eng = Engine([rule(metric="core_m"), rule(metric="gpu_m")])
    eng.step([sample(HI, metric="core_m")], tier="core")
    eng.step([sample(HI, metric="gpu_m", device="gpu0")], tier="gpu")
    eng.step([sample(HI, metric="gpu_m", device="gpu0")], tier="gpu")
    eng.step([], tier="gpu")
    by_metric = {c.metric: c for c in eng.state.active.values()}
    assert by_metric["core_m"].stale is False
    assert by_metric["gpu_m"].stale is True
    eng.step([], tier="core")
    assert by_metric["core_m"].stale is True


def test_inactive_series_counters_are_forgotten_but_active_ones_kept() -> None:
    state = EngineState()
    rules = compile_rules([rule()])
    ids = Ids()
    evaluate(
        state, rules, [sample(LO, device="idle"), sample(HI, device="hot")], tier="core", node=NODE, now=T0, new_id=ids
    )
    assert {k[2] for k in state.series} == {"idle", "hot"}
    assert {c.device for c in state.active.values()} == {"hot"}
    evaluate(state, rules, [], tier="core", node=NODE, now=T0 + SERIES_FORGET_SECONDS - 1, new_id=ids)
    assert {k[2] for k in state.series} == {"idle", "hot"}
    evaluate(state, rules, [], tier="core", node=NODE, now=T0 + SERIES_FORGET_SECONDS + 10, new_id=ids)
    assert {k[2] for k in state.series} == {"hot"}  # the idle series' counters went, the active one's stayed
    assert {c.device for c in state.active.values()} == {"hot"}


# --- retiring rules -----------------------------------------------------------------------------------------------


def test_retire_rules_exits_removed_and_changed_rules_and_keeps_unchanged_ones() -> None:
    keep = rule(metric="keep", enterFor=2)
    change = rule(metric="change")
    drop = rule(metric="drop")
    eng = Engine([keep, change, drop])
    for _ in range(2):
        eng.step([sample(HI, metric="keep"), sample(HI, metric="change"), sample(HI, metric="drop")])
    assert {c.metric for c in eng.state.active.values()} == {"keep", "change", "drop"}
    seq_before = eng.state.seq

    # a reload: the same "keep" rule parsed again, "change" with a new threshold, "drop" gone
    reloaded = [rule(metric="keep", enterFor=2), rule(metric="change", threshold=50.0)]
    assert rule_key(reloaded[0]) == rule_key(keep)
    assert rule_key(reloaded[1]) != rule_key(change)
    new_rules = compile_rules(reloaded)
    now = tick_time(10)
    ids = Ids()
    events = retire_rules(eng.state, new_rules, node=NODE, now=now, new_id=ids)

    assert sorted((ev.phase, ev.detail["metric"]) for ev in events) == [(X, "change"), (X, "drop")]
    for ev in events:
        assert ev.detail["reason"] == "rule_removed"
        assert ev.started_at == tick_time(0)
        assert ev.ended_at == now
    assert sorted(ev.seq for ev in events) == [seq_before + 1, seq_before + 2]
    assert {c.metric for c in eng.state.active.values()} == {"keep"}
    assert {k[1] for k in eng.state.series} == {"keep"}

    # the unchanged rule kept its active state: still breaching means no second ENTER; one clear means EXIT
    eng.rules = new_rules
    assert eng.step([sample(HI, metric="keep")]) == []
    assert [(ev.phase, ev.detail["metric"]) for ev in eng.step([sample(LO, metric="keep")])] == [(X, "keep")]


def test_retire_rules_with_identical_rules_is_a_no_op() -> None:
    eng = Engine([rule(labels={"a": "1", "b": "2"})])
    eng.step([sample(HI, labels={"a": "1", "b": "2"})])
    same = compile_rules([rule(labels={"b": "2", "a": "1"})])
    assert retire_rules(eng.state, same, node=NODE, now=tick_time(5), new_id=Ids()) == []
    assert len(eng.state.active) == 1


def test_retire_all_rules() -> None:
    eng = Engine([rule()])
    eng.step([sample(HI)])
    events = retire_rules(eng.state, {}, node=NODE, now=tick_time(3), new_id=Ids())
    assert [(ev.phase, ev.detail["reason"]) for ev in events] == [(X, "rule_removed")]
    assert eng.state.active == {}
    assert eng.state.series == {}


# --- restart persistence ------------------------------------------------------------------------------------------


def test_dump_load_round_trip() -> None:
    eng = Engine([rule(metric="psi"), rule(metric="t", device="cpu*")])
    eng.step(
        [
            sample(HI, metric="psi", device="memory", labels={"kind": "some", "resource": "memory"}),
            sample(HI, metric="psi", device="memory", labels={"kind": "full", "resource": "memory"}),
            sample(HI, metric="t", device="cpu0"),
        ]
    )
    eng.step([sample(LO, metric="t", device="cpu0")])
    restored = load_state(dump_state(eng.state))
    assert restored.seq == eng.state.seq == 4
    assert set(restored.active) == set(eng.state.active)
    for key, cond in eng.state.active.items():
        back = restored.active[key]
        assert isinstance(back.labels, tuple)
        assert all(isinstance(pair, tuple) for pair in back.labels)
        assert msgspec.structs.replace(back, stale=False) == msgspec.structs.replace(cond, stale=False)
        assert back.stale is True  # unconfirmed until its series is seen again
    assert restored.series == {}
    # a second round trip is stable
    assert dump_state(load_state(dump_state(restored))) == dump_state(restored)


def test_load_state_rejects_damage() -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        load_state(b'{"version": 1, "seq": "x"')
    with pytest.raises(msgspec.ValidationError):
        load_state(b'{"version": 1, "seq": "x", "active": []}')


def test_restart_keeps_active_conditions_and_seq() -> None:
    rules = [rule(metric="m", enterFor=2, exitFor=2), rule(metric="other")]
    before = Engine(rules)
    before.step([sample(HI), sample(HI, metric="other")])
    before.step([sample(HI), sample(LO, metric="other")])
    enters = [ev for _, ev in before.log if ev.phase is E and ev.detail["metric"] == "m"]
    (enter,) = enters
    persisted_seq = before.state.seq
    assert persisted_seq == 3
    blob = dump_state(before.state)

    after = Engine(rules, state=load_state(blob))
    after.tick = 10
    for _ in range(4):
        assert after.step([sample(HI)]) == []  # still breaching: no second ENTER
    (cond,) = after.state.active.values()
    assert cond.stale is False
    assert after.step([sample(LO)]) == []  # exitFor=2
    (exit_,) = after.step([sample(LO)])
    assert exit_.phase is X
    assert exit_.started_at == enter.started_at == tick_time(1)
    assert exit_.ended_at == tick_time(15)
    assert exit_.seq == persisted_seq + 1
    assert (exit_.device, exit_.condition) == (enter.device, enter.condition)
    assert after.state.active == {}
    assert [ph for _, ph in after.transitions()] == [X]


def test_restored_condition_of_a_vanished_series_stays_active_and_stale() -> None:
    eng = Engine([rule()])
    eng.step([sample(HI)])
    after = Engine([rule()], state=load_state(dump_state(eng.state)))
    assert after.step([]) == []
    (cond,) = after.state.active.values()
    assert cond.stale is True


# --- property: strict alternation and hysteresis ------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    breaches=st.lists(st.booleans(), max_size=60),
    enter_for=st.integers(min_value=1, max_value=5),
    exit_for=st.integers(min_value=1, max_value=5),
)
def test_events_alternate_and_respect_hysteresis(breaches: list[bool], enter_for: int, exit_for: int) -> None:
    eng = Engine([rule(enterFor=enter_for, exitFor=exit_for)])
    for b in breaches:
        eng.step([sample(HI if b else LO)])
    phases = [ph for _, ph in eng.transitions()]
    assert phases == [E, X] * (len(phases) // 2) + [E] * (len(phases) % 2)
    for i, ph in eng.transitions():
        if ph is E:
            assert i + 1 >= enter_for
            assert all(breaches[i - enter_for + 1 : i + 1])
        else:
            assert i + 1 >= exit_for
            assert not any(breaches[i - exit_for + 1 : i + 1])
    assert [ev.seq for _, ev in eng.log] == list(range(1, len(eng.log) + 1))

    # an independent oracle of the same hysteresis
    expected: list[tuple[int, Phase]] = []
    active, run_b, run_c = False, 0, 0
    for i, b in enumerate(breaches):
        run_b, run_c = (run_b + 1, 0) if b else (0, run_c + 1)
        if not active and run_b >= enter_for:
            active = True
            expected.append((i, E))
        elif active and run_c >= exit_for:
            active = False
            expected.append((i, X))
    assert eng.transitions() == expected
