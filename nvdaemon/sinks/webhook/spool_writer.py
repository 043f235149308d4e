"""An endpoint's ingest: events from its bus channel into the spool, kept in memory while the stateDir refuses them.

``SpoolWriter.run`` takes what the channel holds into a bounded in-memory ``Buffer``, commits the buffer to the spool
(oldest first, up to ``BATCH`` events per ``synchronous=FULL`` transaction; half as many after a refused one, so a
nearly full disk still takes small ones) and only forgets an event once its transaction has committed. A write the
stateDir refuses (``SpoolUnwritable``: full disk, read-only, I/O error) changes nothing: the events stay in the
buffer, the channel keeps being drained into it, and the write is tried again after a capped exponential backoff
with jitter (``StorageHealth``); a damaged spool (``SpoolCorrupt``) has already been replaced by a fresh one, so the
write is tried again at once.

``committed_through`` is what the engine may be saved up to: the seq before the oldest event still in the buffer,
or the last seq taken when the buffer is empty. It never passes an event that is neither on disk nor dropped and
counted, so ``Agent.persist_engine`` never saves state past an event a crash would lose.

While writes succeed the buffer never holds more than one take (``BATCH``). While they fail it grows, up to
``BUFFER_EVENTS`` events and ``BUFFER_BYTES`` bytes of encoded events (the memory the agent may spend on a full
disk); beyond that the spool's overflow rule applies: the lowest severity goes first, oldest first within a
severity; each drop is reported with its event ids (reason ``spool_unwritable``) to the endpoint, which counts and
logs it. Once writes succeed again the spool's own bounds (``spool.maxEvents``, ``spool.maxBytes``) apply as usual.
"""

from __future__ import annotations

import collections
import heapq
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import trio

from nvdaemon.backoff import EQUAL, backoff
from nvdaemon.config import SpoolConfig
from nvdaemon.model import Event, Severity
from nvdaemon.shutdown import bounded_shield
from nvdaemon.sinks.spool_clock import SteadyClock, system_clock
from nvdaemon.sinks.webhook.spool import SpoolDB
from nvdaemon.sinks.webhook.spool_io import SpoolCorrupt, SpoolUnwritable

log = logging.getLogger(__name__)

BATCH = 1000  # events per transaction, and per take from the channel
BUFFER_EVENTS = 10_000
BUFFER_BYTES = 16 * 1024 * 1024
RETRY_BASE_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0  # a freed disk is noticed within this long
DRAIN_SECONDS = 2.0
LOG_QUIET_SECONDS = 60.0
UNWRITABLE = "spool_unwritable"  # drop reason: the buffer was full while the stateDir refused writes

Caller = Callable[..., Awaitable[Any]]  # Spool.call, as the endpoint wraps it


def severity_rank(severity: str) -> int:
    """Overflow order: lower ranks go first; an unknown severity counts as info."""
    try:
        return int(Severity.parse(severity))
    except KeyError:
        return int(Severity.INFO)


@dataclass(frozen=True)
class Item:
    seq: int
    event_id: str
    severity: int
    body: bytes


class Buffer:
    """Events not yet in the spool, one FIFO per severity (so the overflow victim is found without a scan)."""

    def __init__(self, max_events: int, max_bytes: int) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._fifos: dict[int, collections.deque[Item]] = {}
        self.count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.count

    def add(self, item: Item) -> list[Item]:
        """Append ``item``; return what the bounds pushed out (``item`` itself when it cannot fit at all)."""
        if len(item.body) > self.max_bytes:
            return [item]
        self._fifos.setdefault(item.severity, collections.deque()).append(item)
        self.count += 1
        self.bytes += len(item.body)
        evicted = []
        while self.count > self.max_events or self.bytes > self.max_bytes:
            fifo = self._fifos[min(s for s, f in self._fifos.items() if f)]
            evicted.append(self._pop(fifo))
        return evicted

    def _pop(self, fifo: collections.deque[Item]) -> Item:
        gone = fifo.popleft()
        self.count -= 1
        self.bytes -= len(gone.body)
        return gone

    def oldest(self, n: int) -> list[Item]:
        merged = heapq.merge(*self._fifos.values(), key=lambda i: i.seq)
        return [item for _, item in zip(range(n), merged, strict=False)]

    def remove_oldest(self, items: Iterable[Item]) -> None:
        """Forget ``items``, as returned by ``oldest`` (each is the head of its severity's FIFO, in turn)."""
        for item in items:
            fifo = self._fifos[item.severity]
            assert fifo[0] is item
            self._pop(fifo)

    def min_seq(self) -> int | None:
        heads = [f[0].seq for f in self._fifos.values() if f]
        return min(heads) if heads else None

    def all(self) -> list[Item]:
        return self.oldest(self.count)

    def take_all(self) -> list[Item]:
        """Everything held, oldest first; the buffer is empty afterwards (same bounds)."""
        held = self.all()
        self._fifos.clear()
        self.count = self.bytes = 0
        return held


class StorageHealth:
    """Whether the spool's last write succeeded; the retry delay while it does not.

    On a nearly full disk writes succeed and fail by turns; the log says so once per ``LOG_QUIET_SECONDS`` (the
    first failure of a streak at error, its end at info), not once per turn."""

    def __init__(
        self,
        name: str,
        jitter: Callable[[], float] = random.random,
        base: float = RETRY_BASE_SECONDS,
        cap: float = RETRY_MAX_SECONDS,
    ) -> None:
        self.name = name
        self.jitter = jitter
        self.base = base
        self.cap = cap
        self.error: str | None = None
        self.failures = 0
        self._logged_at = -LOG_QUIET_SECONDS  # time.monotonic() of the last streak start that was logged
        self._streak_logged = False

    def failed(self, why: str) -> None:
        self.failures += 1
        if self.error is None:
            now = time.monotonic()
            self._streak_logged = now - self._logged_at >= LOG_QUIET_SECONDS
            if self._streak_logged:
                self._logged_at = now
                log.error(
                    "%s: the spool in stateDir cannot be written (%s); events are kept in memory and the write retried",
                    self.name,
                    why,
                )
        self.error = why

    def ok(self) -> None:
        if self.error is not None and self._streak_logged:
            log.info("%s: the spool is writable again (after %d failed write(s))", self.name, self.failures)
        self.error, self.failures = None, 0

    def delay(self) -> float:
        """Capped exponential, equal jitter: a floor so a refused write is never retried in a hot loop."""
        return backoff(self.failures, self.base, self.cap, EQUAL, self.jitter())


class SpoolWriter:
    def __init__(
        self,
        name: str,
        spool_config: SpoolConfig,
        health: StorageHealth,
        *,
        on_drop: Callable[[str, list[str]], None],
        on_committed: Callable[[int], None],
        wall: Callable[[], float],
        clock: SteadyClock | None = None,
        buffer_events: int = BUFFER_EVENTS,
        buffer_bytes: int = BUFFER_BYTES,
    ) -> None:
        self.name = name
        self.spool_config = spool_config
        self.health = health
        self.on_drop = on_drop
        self.on_committed = on_committed
        self.wall = wall
        self.clock = clock or system_clock()  # the events' age: see nvdaemon.sinks.spool_clock
        self.buffer = Buffer(buffer_events, buffer_bytes)
        self.taken_seq = 0
        self.batch = BATCH  # events per transaction: halved after a refused one, doubled back after a success
        self._waiting: trio.CancelScope | None = None  # the wait before a retry
        self._woken = False  # ``wake`` came while no wait was on

    def wake(self) -> None:
        """Retry a refused write now: the sender just freed room in the spool."""
        if self._waiting is not None:
            self._waiting.cancel()
        else:
            self._woken = True

    def committed_through(self) -> int:
        oldest = self.buffer.min_seq()
        return self.taken_seq if oldest is None else oldest - 1

    def take(self, ev: Event) -> None:
        self.taken_seq = max(self.taken_seq, ev.seq)
        evicted = self.buffer.add(Item(ev.seq, ev.id, severity_rank(ev.severity), msgspec.json.encode(ev)))
        if evicted:
            self.on_drop(UNWRITABLE, [i.event_id for i in evicted])
            self.on_committed(self.committed_through())

    def take_available(self, events: trio.MemoryReceiveChannel[Event], limit: int = BATCH) -> None:
        for _ in range(limit):
            try:
                self.take(events.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return

    async def flush(self, call: Caller) -> bool:
        """Commit the buffer, oldest first; False when the stateDir refused a write (the rest stays buffered)."""
        sc = self.spool_config
        fresh_retry = True
        while self.buffer:
            items = self.buffer.oldest(self.batch)
            rows = [(i.event_id, i.severity, i.body) for i in items]
            try:
                # Shielded: once the transaction has committed, the buffer must learn it, or the events would be
                # written again (harmless, INSERT OR IGNORE) after the sender may have delivered and deleted them.
                with trio.CancelScope(shield=True):
                    drops = await call(
                        SpoolDB.add, self.name, rows, sc.max_events, sc.max_bytes, self.wall(), self.clock.stamp()
                    )
            except SpoolCorrupt as exc:
                if fresh_retry:  # the damaged file is gone and the next call opens a fresh one
                    fresh_retry = False
                    continue
                self.health.failed(str(exc))
                return False
            except SpoolUnwritable as exc:
                # A transaction too big for the space left would fail forever: the next one is half the size.
                self.batch = max(1, len(items) // 2)
                self.health.failed(str(exc))
                return False
            self.batch = min(BATCH, self.batch * 2)
            self.buffer.remove_oldest(items)
            self.health.ok()
            for why, ids in drops.items():
                if ids:
                    self.on_drop(why, ids)
            self.on_committed(self.committed_through())  # also wakes the sender: there is something to send
        self.on_committed(self.committed_through())
        return True

    async def run(self, call: Caller, events: trio.MemoryReceiveChannel[Event]) -> None:
        try:
            while True:
                if not self.buffer:
                    try:
                        self.take(await events.receive())
                    except trio.EndOfChannel:
                        return
                self.take_available(events)
                if await self.flush(call):
                    continue
                # Refused: keep draining the channel (the bus would drop what it cannot hold) until the retry, or
                # until ``wake`` says room was made (a delivered event deleted from a full spool).
                if self._woken:  # room was made while that write was refused: try again at once
                    self._woken = False
                    continue
                with trio.move_on_after(self.health.delay()) as self._waiting:
                    async for ev in events:
                        self.take(ev)
                    await trio.sleep_forever()
                self._waiting = None
        finally:
            # Stopping: whatever the channel holds goes to the spool too, within a bounded, shielded time.
            with bounded_shield(DRAIN_SECONDS):
                while True:
                    self.take_available(events)
                    if not self.buffer or not await self.flush(call):
                        break
            if self.buffer:
                log.warning(
                    "%s: %d event(s) not in the spool as the writer stops (held in memory for a restart of the task; "
                    "dropped and counted if the endpoint is closed; engine state is not saved past them)",
                    self.name,
                    len(self.buffer),
                )
