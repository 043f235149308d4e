"""What ``GET /v1/state`` and ``GET /v1/status`` answer. Plain data built from the agent's read-only view
(``nvdaemon/view.py``); no secret is ever part of either.

``/v1/state`` is the Go agent's answer (nodevitals-contract.md section 4): a JSON array of the last samples of every
tier, each ``{node, tier, device, metric, kind, value, labels, timestamp}`` with ``kind`` left out for a gauge (a
counter says ``"counter"``), ``labels`` left out when there are none, ``timestamp`` the collection time as Go's
``time.Time`` writes it (RFC 3339 in UTC, ``nvdaemon.gotime.rfc3339``) and ``value`` ``null`` when not finite (Go's
decoder leaves such a value 0 rather than failing the whole array). No tier collected yet: ``[]``.

``/v1/status`` is ours: node, tiers with each collector's status, active conditions (with staleness), recent events,
the supervised tasks, sinks, bus counters and reloads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from nvdaemon import __version__
from nvdaemon.gotime import rfc3339
from nvdaemon.model import Event, Kind

if TYPE_CHECKING:
    from nvdaemon.view import AgentView


class GoSample(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One element of ``/v1/state``, fields in the Go agent's order; the defaults are the values Go omits."""

    node: str
    tier: str
    device: str
    metric: str
    kind: str = ""
    value: float
    labels: dict[str, str] = {}
    timestamp: str


def state_samples(view: AgentView) -> list[GoSample]:
    out: list[GoSample] = []
    times: dict[float, str] = {}  # a tier's samples mostly share a timestamp: format each once
    for tier, snap in sorted(view.snapshots.items()):
        for s in snap.samples:
            ts = s.timestamp or snap.collected_at
            text = times.get(ts)
            if text is None:
                text = times[ts] = rfc3339(ts)
            out.append(
                GoSample(
                    node=view.node,
                    tier=tier,
                    device=s.device,
                    metric=s.metric,
                    kind="counter" if s.kind is Kind.COUNTER else "",
                    value=s.value,
                    labels=dict(s.labels),
                    timestamp=text,
                )
            )
    return out


def event_json(ev: Event) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(ev)
    return out


def task_entries(view: AgentView) -> dict[str, Any]:
    """Every supervised task; a sink task that runs but cannot do all of its job (its stateDir refuses writes) shows
    why as its ``lastError`` and ``degraded: true``, since the task itself has not failed."""
    tasks: dict[str, Any] = {}
    for name, st in sorted(view.tasks.items()):
        entry = st.as_json()
        sink = view.sinks.get(name)
        why = sink.degraded() if sink is not None else None
        if why is not None:
            entry["lastError"], entry["degraded"] = why, True
        tasks[name] = entry
    return tasks


def status_document(view: AgentView) -> dict[str, Any]:
    tiers: dict[str, Any] = {}
    for tier, snap in sorted(view.snapshots.items()):
        tiers[tier] = {
            "collectedAt": snap.collected_at,
            "ticks": view.ticks.get(tier, 0),
            "durationSeconds": round(snap.duration, 6),
            "intervalSeconds": view.interval(tier),
            "samples": len(snap.samples),
            "collectors": {name: st.as_json() for name, st in sorted(snap.collectors.items())},
        }
    conditions = [
        {
            "condition": c.condition,
            "tier": c.tier,
            "device": c.device,
            "metric": c.metric,
            "labels": dict(c.labels),
            "severity": c.severity,
            "value": c.value,
            "threshold": c.threshold,
            "startedAt": c.started_at,
            "lastSeen": c.last_seen,
            "stale": c.stale,
            "eventId": c.enter_id,
        }
        for c in sorted(view.engine.active.values(), key=lambda c: (c.started_at, c.condition, c.device))
    ]
    return {
        "node": view.node,
        "version": __version__,
        "startedAt": view.started_at,
        "ready": view.ready,
        "config": view.config_source,
        "tiers": tiers,
        "conditions": conditions,
        "recentEvents": [event_json(ev) for ev in view.bus.recent],
        "eventSeq": view.engine.seq,
        "eventSeqReserved": view.engine.reserved,
        "eventSeqUnreserved": view.engine.unreserved,
        "tasks": task_entries(view),
        "sinks": {name: sink.state() for name, sink in sorted(view.sinks.items())},
        "bus": {"published": view.bus.published, "dropped": dict(view.bus.drop_totals)},
        "reloads": {"ok": view.reloads, "rejected": view.reload_failures},
        "kernelLog": view.kmsg.status() if view.kmsg is not None else {"enabled": False},
    }
