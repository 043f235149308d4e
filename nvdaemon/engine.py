"""The rule engine: threshold rules with hysteresis, evaluated per full series. Pure: no I/O, no trio, time passed in.

State is kept per (rule, metric, device, labels), so PSI ``some`` and ``full`` of one resource are two series with
two states, unlike the Go agent which keyed on (metric, device) only. A condition becomes active after ``enterFor``
consecutive breaching samples (ENTER) and inactive after ``exitFor`` consecutive clear ones (EXIT). A series that
stops arriving while active stays active and is marked stale: a vanished device is not a healthy one.

``EngineState`` is what must survive a restart: the event sequence number, the active conditions and the GPUs lost
now (see ``dump_state`` / ``load_state``); the per-series counters are cheap to rebuild and are not persisted. Every
event seq is drawn here (``draw_seq``); where it may be issued without ever being issued twice is the durable mark
``nvdaemon/seqmark.py`` keeps in stateDir and records in ``EngineState.reserved``.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from nvdaemon.config import Rule
from nvdaemon.model import Event, Labels, Phase, Sample

SeriesKey = tuple[str, str, str, Labels]
"""(rule key, metric, device, labels)."""

IdFactory = Callable[[float], str]
PodsOf = Callable[[str], list[dict[str, str]] | None]

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
SERIES_FORGET_SECONDS = 3600.0
"""Counters of an inactive series not seen for this long are dropped (container veths come and go)."""


@dataclass(frozen=True)
class CompiledRule:
    rule: Rule
    key: str  # digest of the rule's definition: unchanged rules keep their state across reloads
    glob: bool

    def matches(self, sample: Sample) -> bool:
        r = self.rule
        if r.device:
            if self.glob:
                if not fnmatch.fnmatchcase(sample.device, r.device):
                    return False
            elif sample.device != r.device:
                return False
        if r.labels:
            have = dict(sample.labels)
            return all(have.get(k) == v for k, v in r.labels.items())
        return True


def rule_key(rule: Rule) -> str:
    return hashlib.sha256(msgspec.json.encode(rule, order="sorted")).hexdigest()[:16]


def compile_rules(rules: Sequence[Rule]) -> dict[str, list[CompiledRule]]:
    """Index rules by metric, so a tick costs one dict lookup per sample."""
    out: dict[str, list[CompiledRule]] = {}
    for rule in rules:
        glob = any(ch in rule.device for ch in "*?[")
        out.setdefault(rule.metric, []).append(CompiledRule(rule, rule_key(rule), glob))
    return out


class ActiveCondition(msgspec.Struct):
    """A condition that has ENTERed and not yet EXITed."""

    rule_key: str
    metric: str
    device: str
    labels: Labels
    condition: str
    severity: str
    tier: str
    threshold: float
    started_at: float
    enter_id: str
    value: float
    last_seen: float
    stale: bool = False
    # Holders of the GPU when the condition ENTERed (pod attribution, gpu tier only): its EXIT names them too, after
    # a restart as well. None: attribution off or not a GPU.
    pods: list[dict[str, str]] | None = None


@dataclass
class SeriesCounters:
    breach: int = 0
    clear: int = 0
    last_seen: float = 0.0
    prev_value: float | None = None  # for rate rules
    prev_time: float = 0.0


@dataclass
class EngineState:
    seq: int = 0  # the last event seq issued
    active: dict[SeriesKey, ActiveCondition] = field(default_factory=dict)
    series: dict[SeriesKey, SeriesCounters] = field(default_factory=dict)
    # The gpu_lost ENTER of every GPU lost now, by event id: conditions no rule owns (nvdaemon/gpu keeps them up to
    # date), persisted beside the rule conditions so that a restart neither repeats the ENTER nor loses the EXIT.
    lost_gpus: dict[str, Event] = field(default_factory=dict)
    # The seq up to which stateDir holds a reservation (nvdaemon/seqmark.py); None: no mark is kept (the engine
    # alone, in tests). ``unreserved`` counts the seqs issued past it: a restart before the next reservation is
    # saved could issue those again.
    reserved: int | None = None
    unreserved: int = 0


def draw_seq(state: EngineState) -> int:
    """The next event seq: the one ordering of rule, XID and lost-GPU events."""
    state.seq += 1
    if state.reserved is not None and state.seq > state.reserved:
        state.unreserved += 1
    return state.seq


def _rate(counters: SeriesCounters, sample: Sample) -> float | None:
    """Per-second increase since the previous sample; a decrease is a counter reset (the counter restarted at 0)."""
    prev, prev_t = counters.prev_value, counters.prev_time
    counters.prev_value, counters.prev_time = sample.value, sample.timestamp
    if prev is None or sample.timestamp <= prev_t:
        return None
    increase = sample.value - prev if sample.value >= prev else sample.value
    return increase / (sample.timestamp - prev_t)


def transition_event(
    state: EngineState, cond: ActiveCondition, phase: Phase, node: str, now: float, new_id: IdFactory, **extra: object
) -> Event:
    """The ENTER or EXIT of ``cond`` now, with the next seq; ``extra`` joins its detail."""
    seq = draw_seq(state)
    detail: dict[str, object] = {
        "value": cond.value,
        "threshold": cond.threshold,
        "metric": cond.metric,
        "labels": dict(cond.labels),
        **extra,
    }
    if cond.pods is not None:
        detail["pods"] = [dict(p) for p in cond.pods]
    return Event(
        id=new_id(now),
        node=node,
        tier=cond.tier,
        device=cond.device,
        condition=cond.condition,
        phase=phase,
        severity=cond.severity,
        seq=seq,
        started_at=cond.started_at,
        ended_at=now if phase is Phase.EXIT else None,
        detail=detail,
    )


def evaluate(
    state: EngineState,
    rules: dict[str, list[CompiledRule]],
    samples: Iterable[Sample],
    *,
    tier: str,
    node: str,
    now: float,
    new_id: IdFactory,
    pods: PodsOf | None = None,
) -> list[Event]:
    """Feed one tick of ``tier``'s samples through the rules; update ``state`` in place; return the transitions.

    ``pods(device)``: the holders an ENTER on ``device`` records (GPU pod attribution), None when unknown."""
    events: list[Event] = []
    seen: set[SeriesKey] = set()
    for sample in samples:
        candidates = rules.get(sample.metric)
        if not candidates:
            continue
        for cr in candidates:
            if not cr.matches(sample):
                continue
            key: SeriesKey = (cr.key, sample.metric, sample.device, sample.labels)
            seen.add(key)
            counters = state.series.get(key)
            if counters is None:
                counters = state.series[key] = SeriesCounters()
            counters.last_seen = now
            rule = cr.rule
            value: float | None = sample.value
            if rule.rate:
                value = _rate(counters, sample)
            if value is None or math.isnan(value):
                continue
            breaching = _OPS[rule.op](value, rule.threshold)
            active = state.active.get(key)
            if breaching:
                counters.breach += 1
                counters.clear = 0
            else:
                counters.clear += 1
                counters.breach = 0
            if active is not None:
                active.value, active.last_seen, active.stale = value, now, False
                if counters.clear >= rule.exit_for:
                    del state.active[key]
                    events.append(transition_event(state, active, Phase.EXIT, node, now, new_id))
            elif counters.breach >= rule.enter_for:
                cond = ActiveCondition(
                    rule_key=cr.key,
                    metric=sample.metric,
                    device=sample.device,
                    labels=sample.labels,
                    condition=rule.condition,
                    severity=rule.severity,
                    tier=tier,
                    threshold=rule.threshold,
                    started_at=now,
                    enter_id="",
                    value=value,
                    last_seen=now,
                    pods=pods(sample.device) if pods is not None else None,
                )
                ev = transition_event(state, cond, Phase.ENTER, node, now, new_id)
                cond.enter_id = ev.id
                state.active[key] = cond
                events.append(ev)
    for key, cond in state.active.items():
        if cond.tier == tier and key not in seen:
            cond.stale = True
    for key in [k for k, c in state.series.items() if now - c.last_seen > SERIES_FORGET_SECONDS]:
        if key not in state.active:
            del state.series[key]
    return events


def retire_rules(
    state: EngineState,
    rules: dict[str, list[CompiledRule]],
    *,
    node: str,
    now: float,
    new_id: IdFactory,
    also_live: Iterable[str] = (),
) -> list[Event]:
    """After a reload or restart: EXIT the active conditions whose rule no longer exists, and drop their state.
    ``also_live``: the keys of conditions other sources own and still run (the kernel log's rules).

    Receivers and NVSentinel must not be left holding a condition nothing will ever clear.
    """
    live = {cr.key for crs in rules.values() for cr in crs} | set(also_live)
    events = []
    for key in [k for k, c in state.active.items() if c.rule_key not in live]:
        cond = state.active.pop(key)
        events.append(transition_event(state, cond, Phase.EXIT, node, now, new_id, reason="rule_removed"))
    for key in [k for k in state.series if k[0] not in live]:
        del state.series[key]
    return events


class _Persisted(msgspec.Struct):
    version: int
    seq: int
    active: list[ActiveCondition]
    lost_gpus: list[Event] = msgspec.field(default_factory=list)  # absent from files written before it existed


def dump_state(state: EngineState) -> bytes:
    lost = sorted(state.lost_gpus.values(), key=lambda ev: ev.seq)
    return msgspec.json.encode(_Persisted(version=1, seq=state.seq, active=list(state.active.values()), lost_gpus=lost))


def load_state(data: bytes) -> EngineState:
    """Inverse of ``dump_state``; raises ``msgspec.DecodeError``/``ValidationError`` on a damaged file."""
    persisted = msgspec.json.decode(data, type=_Persisted)
    state = EngineState(seq=persisted.seq)
    for cond in persisted.active:
        labels: Labels = tuple((str(k), str(v)) for k, v in cond.labels)
        cond.labels = labels
        # Until its series is seen again, a restored condition's device is unconfirmed.
        cond.stale = True
        state.active[(cond.rule_key, cond.metric, cond.device, labels)] = cond
    state.lost_gpus = {ev.id: ev for ev in persisted.lost_gpus}
    return state
