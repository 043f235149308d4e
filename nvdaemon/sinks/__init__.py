"""Sinks: consumers of the event bus (webhook senders, NVSentinel, the websocket hub), each supervised as a task.

A sink's bus subscription is made when the agent adopts it (``attach``), not when its task starts: the channel
outlives a crash of the task, so events published while the task waits out its restart backoff are still there when
it comes back. Builders only construct; a built sink identical to a running one is discarded without attaching.

To add a sink kind, write a module with a ``Sink`` subclass and a builder ``(agent) -> list[Sink]`` that reads the
config, and list the builder in ``BUILDERS``. The agent starts every built sink before the tier loops (so no event is
published before its subscribers exist), restarts a sink whose ``fingerprint`` changed on reload, and includes each
sink's ``metrics()`` in /metrics and ``state()`` in /v1/status under ``sinks``; ``degraded()`` shows as the sink task's
``lastError`` there, ``state_writable()`` as ``nodevitals_sink_state_writable{sink}``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client.core import Metric

from nvdaemon.bus import EventBus
from nvdaemon.model import Event

if TYPE_CHECKING:
    from nvdaemon.app import Agent


class Sink(abc.ABC):
    name: str  # unique task name and bus subscriber name, e.g. "webhook:backend.example"
    critical: bool = False  # a sink failing repeatedly makes /healthz fail only if critical
    capacity: int = 1024  # bus channel size: events beyond it while the sink lags are dropped and counted
    durable: bool = False  # the engine's state is saved only after this sink has made its events durable
    # A durable sink: the highest event seq up to which every event it was given is on disk, or dropped and counted.
    # Never past an event it still holds only in memory (e.g. while its stateDir refuses writes).
    committed_seq: int = 0
    events: trio.MemoryReceiveChannel[Event]
    _bus: EventBus | None = None
    _committed: trio.Event | None = None

    @abc.abstractmethod
    def fingerprint(self) -> Hashable:
        """Everything in the config this sink depends on; a change restarts it on reload."""

    @abc.abstractmethod
    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Consume events until cancelled; flush what must not be lost in a shielded, deadline-bound finally."""

    def attach(self, bus: EventBus) -> None:
        """Subscribe to the bus; called once, when the agent adopts this sink."""
        self._bus = bus
        self.events = bus.subscribe(self.name, self.capacity)
        # Events published before this sink existed are not its to make durable.
        self.committed_seq = bus.last_seq
        self._committed = trio.Event()

    def mark_committed(self, seq: int) -> None:
        """A durable sink calls this once events up to ``seq`` are safe from a crash (e.g. committed to disk)."""
        if seq > self.committed_seq:
            self.committed_seq = seq
            if self._committed is not None:
                self._committed.set()
            self._committed = trio.Event()

    async def wait_committed(self, seq: int) -> None:
        while self.committed_seq < seq:
            if self._committed is None:
                self._committed = trio.Event()
            await self._committed.wait()

    def close(self) -> None:
        """Unsubscribe; called when the sink is replaced or removed, or the agent stops (after its task has stopped).
        A replacement subscribed under the same name first keeps its subscription."""
        bus, self._bus = self._bus, None
        if bus is not None:
            sub = bus.subscriptions.get(self.name)
            if sub is not None and sub.receive is self.events:
                bus.unsubscribe(self.name)

    def metrics(self) -> Iterable[Metric]:
        return ()

    def state(self) -> dict[str, Any]:
        return {}

    def dropped_counts(self) -> dict[str, int]:
        """Events this sink gave up on since start, by reason (each also logged with its event ids)."""
        return {}

    def degraded(self) -> str | None:
        """Why the sink runs but cannot do all of its job (e.g. its stateDir refuses writes), else None. Shown as its
        task's ``lastError`` in the status document."""
        return None

    def state_writable(self) -> bool | None:
        """Whether the sink's last write to stateDir succeeded; None for a sink that keeps nothing there."""
        return None


Builder = Callable[["Agent"], list[Sink]]


def _stream(agent: Agent) -> list[Sink]:
    from nvdaemon.sinks.stream import build  # imported late: the sink modules import this one

    return build(agent)


def _webhook(agent: Agent) -> list[Sink]:
    if not agent.loaded.config.sinks.webhook:
        return []  # keep httpx and sqlite out of an agent that has no webhook (memory on every node)
    from nvdaemon.sinks.webhook import build

    return build(agent)


def _nvsentinel(agent: Agent) -> list[Sink]:
    if not agent.loaded.config.sinks.nvsentinel.enabled:
        return []  # keep grpc (about 10 MiB resident) out of agents that do not talk to NVSentinel
    from nvdaemon.sinks.nvsentinel import build

    return build(agent)


def _history(agent: Agent) -> list[Sink]:
    if not agent.loaded.config.history.enabled:
        return []  # keep sqlite out of agents that keep no history
    from nvdaemon.history.service import build

    return build(agent)


BUILDERS: tuple[Builder, ...] = (_stream, _webhook, _nvsentinel, _history)


def build_sinks(agent: Agent) -> list[Sink]:
    return [sink for builder in BUILDERS for sink in builder(agent)]
