"""What ``GET /v1/state`` and ``GET /v1/status`` answer. Plain data built from the agent; no secret is ever part of
either.

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
    from nvdaemon.app import Agent


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


def state_samples(agent: Agent) -> list[GoSample]:
    out: list[GoSample] = []
    times: dict[float, str] = {}  # a tier's samples mostly share a timestamp: format each once
    for tier, snap in sorted(agent.snapshots.items()):
        for s in snap.samples:
            ts = s.timestamp or snap.collected_at
            text = times.get(ts)
            if text is None:
                text = times[ts] = rfc3339(ts)
            out.append(
                GoSample(
                    node=agent.node,
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


def status_document(agent: Agent) -> dict[str, Any]:
    tiers: dict[str, Any] = {}
    for tier, snap in sorted(agent.snapshots.items()):
        tiers[tier] = {
            "collectedAt": snap.collected_at,
            "durationSeconds": round(snap.duration, 6),
            "intervalSeconds": agent.interval(tier),
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
        for c in sorted(agent.engine.active.values(), key=lambda c: (c.started_at, c.condition, c.device))
    ]
    sup = agent.supervisor
    return {
        "node": agent.node,
        "version": __version__,
        "startedAt": agent.started_at,
        "ready": agent.ready,
        "config": agent.loaded.source,
        "tiers": tiers,
        "conditions": conditions,
        "recentEvents": [event_json(ev) for ev in agent.bus.recent],
        "eventSeq": agent.engine.seq,
        "tasks": {name: st.as_json() for name, st in sorted(sup.tasks.items())} if sup else {},
        "sinks": {name: sink.state() for name, sink in sorted(agent.sinks.items())},
        "bus": {"published": agent.bus.published, "dropped": dict(agent.bus.drop_totals)},
        "reloads": {"ok": agent.reloads, "rejected": agent.reload_failures},
    }
