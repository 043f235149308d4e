"""Sinks: consumers of the agent's events (webhook senders, NVSentinel, the websocket hub) and of its snapshots (the
history writer, ``nvdaemon.history``), each supervised as a task.

What a sink is (``Sink`` and the smaller protocols, ``SinkContext``, the shared implementations) is in
``nvdaemon.sinks.base``, re-exported here; this module lists the builders. Each sink is a package (``webhook``,
``nvsentinel``, ``stream``) whose ``__init__`` says what it promises; what two sinks share stays here
(``cloudevent``, ``spool_clock``). To add a sink kind, write a package with a class that has those members and a
builder ``(SinkContext) -> list[Sink]``, and list the builder in ``BUILDERS``. A sink module imports
``nvdaemon.sinks.base``, never this module: this one imports the sink modules (each only when
configured, to keep its dependencies out of an agent that does not use it). Builders only construct; a built sink
identical to a running one is discarded without attaching. The agent starts every built sink before the tier loops
(so no event is published before its subscribers exist) and restarts a sink whose ``fingerprint`` changed on reload.
"""

from __future__ import annotations

from collections.abc import Callable

from nvdaemon.sinks.base import (
    BusSubscriber,
    CommitTracker,
    Durable,
    EventConsumer,
    Observable,
    ObservableDefaults,
    Sink,
    SinkContext,
    SnapshotConsumer,
)

__all__ = [
    "BUILDERS",
    "Builder",
    "BusSubscriber",
    "CommitTracker",
    "Durable",
    "EventConsumer",
    "Observable",
    "ObservableDefaults",
    "Sink",
    "SinkContext",
    "SnapshotConsumer",
    "build_sinks",
]


# ---- builders -------------------------------------------------------------------------------------------------
Builder = Callable[[SinkContext], list[Sink]]


def _stream(ctx: SinkContext) -> list[Sink]:
    if not ctx.stream.enabled:
        return []
    from nvdaemon.sinks.stream.hub import StreamHub  # like each sink module: loaded only when configured

    return [StreamHub(ctx)]


def _webhook(ctx: SinkContext) -> list[Sink]:
    if not ctx.webhooks:
        return []  # keep httpx and sqlite out of an agent that has no webhook (memory on every node)
    from nvdaemon.sinks.webhook.endpoint import build

    return build(ctx)


def _nvsentinel(ctx: SinkContext) -> list[Sink]:
    if not ctx.nvsentinel.enabled:
        return []  # keep grpc (about 10 MiB resident) out of agents that do not talk to NVSentinel
    from nvdaemon.sinks.nvsentinel.sink import NvsentinelHealthSink

    return [NvsentinelHealthSink(ctx)]


def _history(ctx: SinkContext) -> list[Sink]:
    if not ctx.history.enabled:
        return []  # keep sqlite out of agents that keep no history
    from nvdaemon.history.service import HistorySink

    return [HistorySink(ctx)]


BUILDERS: tuple[Builder, ...] = (_stream, _webhook, _nvsentinel, _history)


def build_sinks(ctx: SinkContext) -> list[Sink]:
    return [sink for builder in BUILDERS for sink in builder(ctx)]
