"""The ``/v1/state`` document: node, tiers, current samples, active conditions (with staleness), recent events and
the status of every supervised task. Plain data built from the agent; no secret is ever part of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from nvdaemon import __version__
from nvdaemon.model import Event, Sample

if TYPE_CHECKING:
    from nvdaemon.app import Agent


def sample_json(s: Sample) -> dict[str, Any]:
    return {
        "metric": s.metric,
        "device": s.device,
        "value": s.value,
        "kind": s.kind.value,
        "labels": dict(s.labels),
        "tier": s.tier,
        "timestamp": s.timestamp,
    }


def event_json(ev: Event) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(ev)
    return out


def task_entries(agent: Agent) -> dict[str, Any]:
    """Every supervised task; a sink task that runs but cannot do all of its job (its stateDir refuses writes) shows
    why as its ``lastError`` and ``degraded: true``, since the task itself has not failed."""
    sup = agent.supervisor
    if sup is None:
        return {}
    tasks: dict[str, Any] = {}
    for name, st in sorted(sup.tasks.items()):
        entry = st.as_json()
        sink = agent.sinks.get(name)
        why = sink.degraded() if sink is not None else None
        if why is not None:
            entry["lastError"], entry["degraded"] = why, True
        tasks[name] = entry
    return tasks


def state_document(agent: Agent) -> dict[str, Any]:
    tiers: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []
    for tier, snap in sorted(agent.snapshots.items()):
        tiers[tier] = {
            "collectedAt": snap.collected_at,
            "durationSeconds": round(snap.duration, 6),
            "intervalSeconds": agent.interval(tier),
            "collectors": {name: st.as_json() for name, st in sorted(snap.collectors.items())},
        }
        samples += [sample_json(s) for s in snap.samples]
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
    return {
        "node": agent.node,
        "version": __version__,
        "startedAt": agent.started_at,
        "ready": agent.ready,
        "config": agent.loaded.source,
        "tiers": tiers,
        "samples": samples,
        "conditions": conditions,
        "recentEvents": [event_json(ev) for ev in agent.bus.recent],
        "eventSeq": agent.engine.seq,
        "tasks": task_entries(agent),
        "sinks": {name: sink.state() for name, sink in sorted(agent.sinks.items())},
        "bus": {"published": agent.bus.published, "dropped": dict(agent.bus.drop_totals)},
        "reloads": {"ok": agent.reloads, "rejected": agent.reload_failures},
    }
