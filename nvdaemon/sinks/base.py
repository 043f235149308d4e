"""What a sink is, in small protocols, and the pieces every sink shares (re-exported by ``nvdaemon.sinks``). A sink
module imports them from here, never from the package's ``__init__``: that one lists the builders, which import the
sink modules, so the protocols live below both and no sink module imports the list that imports it.

A sink is built from a ``SinkContext``: the config slices, node, stateDir and tiers it is built from, and callbacks
for what changes while it runs (the engine's active conditions, the rules in force, the GPUs lost or answering, and
``note_change`` to tell the metrics cache that something /metrics shows changed). It keeps what it uses at
construction, and its ``fingerprint`` is made of those values only, so a reload that changes any of them builds a
sink whose fingerprint differs from the running one's, which is then replaced.

- ``Sink``: ``take_over(old)``: a sink a reload builds to replace a running one of the same name takes what the old
  one still holds (events it had not yet handled, its counters) before the old one is closed, so a replacement
  neither loses an event nor sets a counter in /metrics back (``ObservableDefaults``: nothing to take).
- ``EventConsumer``: a bus subscription (``name``, ``capacity``, ``attach``, ``events``, ``serve``, ``close``). The
  subscription is made when the agent adopts the sink (``attach``), not when its task starts: the channel outlives a
  crash of the task, so events published while the task waits out its restart backoff are still there when it comes
  back. ``BusSubscriber`` implements it.
- ``SnapshotConsumer``: ``ingest(snapshot)``: a sink fed the tier loops' snapshots (history) is handed each one by
  the agent (``Agent.on_snapshot``), as an event consumer is handed events by the bus.
- ``Durable``: ``committed_seq``, ``wait_committed``, ``mark_committed``: the engine's state is saved only up to the
  events every durable sink has made safe from a crash (``CommitTracker`` implements it).
- ``Observable``: ``metrics()`` in /metrics, ``state()`` in /v1/status under ``sinks``, ``dropped_counts()``,
  ``degraded()`` (shown as the sink task's ``lastError``), ``state_writable()`` (``nodevitals_sink_state_writable``);
  ``ObservableDefaults`` gives the empty answers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import trio

from nvdaemon.bus import EventBus
from nvdaemon.exposition import Metric
from nvdaemon.model import Event

if TYPE_CHECKING:  # types only: the config structs and conditions a context carries, the snapshots a sink reads
    from nvdaemon.config import (
        HistoryConfig,
        NvsentinelSink,
        Rule,
        RuleNvsentinel,
        SpoolConfig,
        StreamSink,
        WebhookSink,
    )
    from nvdaemon.engine import ActiveCondition
    from nvdaemon.model import TierSnapshot


@dataclass(frozen=True)
class SinkContext:
    """What sinks are built from (``Agent.sink_context``). Values are the config in force when it was made; the
    callables read what changes while the sinks run, and return values, never the objects that hold them."""

    node: str
    state_dir: Path
    tiers: tuple[str, ...]  # configured tiers
    interval_seconds: float  # the core tiers' interval: NVSentinel's reconcile tick
    proc_root: str
    gpu_xid: bool  # gpu.xid: the XID check is reported when the gpu tier is configured too
    stream: StreamSink
    webhooks: tuple[WebhookSink, ...]
    spool: SpoolConfig
    nvsentinel: NvsentinelSink
    history: HistoryConfig
    note_change: Callable[[], None]  # something /metrics shows changed besides snapshots and events
    rules: Callable[[], Sequence[Rule]]  # the rules in force (a reload changes them without rebuilding sinks)
    active_conditions: Callable[[], Iterable[ActiveCondition]]  # the engine's active conditions now
    gpus_lost: Callable[[], list[Event]]  # the gpu_lost ENTER of every GPU lost now; [] without a GPU runtime
    gpus_answering: Callable[[], list[tuple[str, str, str]]]  # (device, uuid, PCI address) answering NVML now
    # The kernel-log rules' NVSentinel overrides by the key their conditions carry (kmsg/rules.py)
    kernel_overrides: Callable[[], Mapping[str, RuleNvsentinel | None]] = dict


# ---- the protocols --------------------------------------------------------------------------------------------
class Observable(Protocol):
    def metrics(self) -> Iterable[Metric]: ...

    def state(self) -> dict[str, Any]: ...

    def dropped_counts(self) -> dict[str, int]:
        """Events this sink gave up on since start, by reason (each also logged with its event ids)."""
        ...

    def degraded(self) -> str | None:
        """Why the sink runs but cannot do all of its job (e.g. its stateDir refuses writes), else None."""
        ...

    def state_writable(self) -> bool | None:
        """Whether the sink's last write to stateDir succeeded; None for a sink that keeps nothing there."""
        ...


class Sink(Observable, Protocol):
    """What the agent supervises, replaces on reload and shows in /metrics and /v1/status."""

    name: str  # unique task name (and bus subscriber name), e.g. "webhook:backend.example"
    critical: bool  # a sink failing repeatedly makes /healthz fail only if critical

    def fingerprint(self) -> Hashable:
        """The values this sink was built from; a reload that changes one replaces it."""
        ...

    def attach(self, bus: EventBus) -> None:
        """Called once, when the agent adopts this sink (before its task starts)."""
        ...

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled; flush what must not be lost in a shielded, deadline-bound finally."""
        ...

    def take_over(self, old: Sink) -> None:
        """Called when this sink replaces ``old`` (same name) on reload: after ``old``'s task has stopped and this
        one is attached (so ``old``'s channel gets nothing more), before ``old.close()`` and before this one's task
        starts. Take what ``old`` has not yet handled, in order, and carry its counters on; what is taken here is
        this sink's to deliver or to count as dropped. ``old`` is of the same class (the same name)."""
        ...

    def close(self) -> None:
        """Called when the sink is replaced or removed, or the agent stops (after its task has stopped)."""
        ...


class EventConsumer(Sink, Protocol):
    capacity: int  # bus channel size: events beyond it while the sink lags are dropped and counted
    events: trio.MemoryReceiveChannel[Event]


@runtime_checkable
class SnapshotConsumer(Protocol):
    """A sink fed the tier loops' snapshots rather than bus events (history). ``Agent.on_snapshot`` hands each
    snapshot to every running sink that has this member, in the tier loop's task, after the rules have seen it: it
    must only take what it needs in memory (no await, no I/O) and leave the rest to its own task."""

    def ingest(self, snap: TierSnapshot) -> None: ...


@runtime_checkable
class Durable(Protocol):
    """A sink that makes events safe from a crash: the engine's state is saved only once each of these holds the
    events that led there (``Agent.persist_engine``)."""

    # The highest event seq up to which every event it was given is on disk, or dropped and counted. Never past an
    # event it still holds only in memory (e.g. while its stateDir refuses writes).
    committed_seq: int

    def mark_committed(self, seq: int) -> None: ...

    async def wait_committed(self, seq: int) -> None: ...


# ---- shared implementations -----------------------------------------------------------------------------------
class ObservableDefaults:
    """The answers of a sink with nothing to say: no metrics, no state, nothing dropped, never degraded."""

    critical: bool = False

    def metrics(self) -> Iterable[Metric]:
        return ()

    def state(self) -> dict[str, Any]:
        return {}

    def dropped_counts(self) -> dict[str, int]:
        return {}

    def degraded(self) -> str | None:
        return None

    def state_writable(self) -> bool | None:
        return None

    def take_over(self, old: Sink) -> None:
        """A sink that holds nothing between runs of its task takes nothing over."""


class BusSubscriber:
    """``EventConsumer``'s subscription: ``attach`` subscribes under ``name``, ``close`` lets go of it."""

    name: str
    capacity: int = 1024
    events: trio.MemoryReceiveChannel[Event]
    _bus: EventBus | None = None

    def attach(self, bus: EventBus) -> None:
        self._bus = bus
        self.events = bus.subscribe(self.name, self.capacity)

    def leftovers(self) -> list[Event]:
        """Take what the channel still holds, oldest first. Once a replacement has subscribed under the same name
        (which closes this channel for sending) that is everything this subscription will ever get."""
        left = []
        while True:
            try:
                left.append(self.events.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return left

    def close(self) -> None:
        """Unsubscribe. A replacement subscribed under the same name first keeps its subscription."""
        bus, self._bus = self._bus, None
        if bus is not None:
            sub = bus.subscriptions.get(self.name)
            if sub is not None and sub.receive is self.events:
                bus.unsubscribe(self.name)


class CommitTracker:
    """``Durable``'s bookkeeping. ``start_committed`` is called on attach: events published before the sink existed
    are not its to make durable. A replaced sink hands what it had not committed to its successor
    (``pass_commits_to``); a wait on it then goes on as a wait on the successor, so ``Agent.persist_engine`` neither
    waits out its deadline on a sink that will never commit again nor saves past what the successor holds."""

    committed_seq: int = 0
    _committed: trio.Event | None = None
    _successor: CommitTracker | None = None

    def start_committed(self, seq: int) -> None:
        self.committed_seq = seq
        self._committed = trio.Event()

    def mark_committed(self, seq: int) -> None:
        """Events up to ``seq`` are safe from a crash (e.g. committed to disk)."""
        if seq > self.committed_seq:
            self.committed_seq = seq
            if self._committed is not None:
                self._committed.set()
            self._committed = trio.Event()

    def pass_commits_to(self, successor: CommitTracker) -> None:
        """``successor`` now holds what this one had not committed: waiters move on to it."""
        self._successor = successor
        if self._committed is not None:
            self._committed.set()
        self._committed = None

    async def wait_committed(self, seq: int) -> None:
        tracker = self
        while tracker.committed_seq < seq:
            if tracker._successor is not None:
                tracker = tracker._successor
                continue
            if tracker._committed is None:
                tracker._committed = trio.Event()
            await tracker._committed.wait()
