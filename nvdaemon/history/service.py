"""The history task: a sink named ``history`` that takes its samples from the agent's snapshots rather than from the
event bus (a ``SnapshotConsumer``: ``ingest``, handed each snapshot by ``Agent.on_snapshot``, accumulates in memory
only), and writes the complete windows every ``history.intervalMinutes``, just after each window ends. It has the
members of the sinks' protocols (``nvdaemon.sinks.base``) without importing them: the sinks' list builds it, and
history depends on the core alone (``HistoryContext`` is what it reads of the ``SinkContext`` it is built from).

Every sqlite call runs in a worker thread under one ``CapacityLimiter(1)`` (flushes and ``/v1/history`` queries
alike), so the connection is only ever used by one thread at a time. On stop (SIGTERM, reload, a crash) a shielded,
deadline-bound final flush writes the complete windows and saves the windows in progress to the ``pending`` table,
which the next start reads back: a graceful restart loses only the samples it did not take, a crash at most the
window in progress. A database sqlite calls corrupt, when opened or later, is moved aside and a fresh one started.
A flush the stateDir refuses (full, read-only) keeps its windows in memory for the next one (``lastError``).
A history task replaced by a reload hands its counters, and the windows still in its memory (samples ingested after
its final flush, or windows a refused flush kept) when the window length is the same, to its successor.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import trio

from nvdaemon.bus import EventBus
from nvdaemon.config import HISTORY_FILE_IN_DATA_DIR
from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, Metric
from nvdaemon.history.core import MAX_POINTS, Query, Windows, allowlist, window_end
from nvdaemon.shutdown import bounded_shield

if TYPE_CHECKING:
    from nvdaemon.config import HistoryConfig
    from nvdaemon.history.store import HistoryStore, QueryResult
    from nvdaemon.model import TierSnapshot

log = logging.getLogger(__name__)
T = TypeVar("T")

SETTLE_SECONDS = 5.0  # a window is written this long after it ends: a tick stamped just before has time to land
FINAL_FLUSH_SECONDS = 5.0  # at most, and never past the shutdown deadline


class Unavailable(Exception):
    """The store is not open (the task is starting or restarting)."""


class HistoryContext(Protocol):
    """What history is built from: the members of the sinks' ``SinkContext`` it reads."""

    @property
    def node(self) -> str: ...

    @property
    def state_dir(self) -> Path: ...

    @property
    def history(self) -> HistoryConfig: ...

    @property
    def note_change(self) -> Callable[[], None]: ...  # something /metrics shows changed


class HistorySink:
    """A ``Sink`` and ``SnapshotConsumer`` (no bus subscription, not durable, not critical) built from a
    ``HistoryContext``: the history settings, the node (queries for another node find nothing here) and the database
    path are kept from it; its final flush is bounded by ``FINAL_FLUSH_SECONDS`` and the shutdown deadline
    (``shutdown.bounded_shield``)."""

    name = "history"
    critical = False

    def __init__(self, ctx: HistoryContext, wall: Callable[[], float] = time.time) -> None:
        self.config = config = ctx.history
        self.node = ctx.node
        self._note_change = ctx.note_change
        self.wall = wall
        self.path = history_path(config, ctx.state_dir)
        self.windows = Windows(config.interval_minutes * 60, allowlist(config.metrics))
        self.store: HistoryStore | None = None
        self.limiter = trio.CapacityLimiter(1)
        self.points_written = 0
        self.series = 0
        self.db_bytes = 0
        self.flushes = 0
        self.quarantined = 0
        self.flushes_refused = 0  # in a row: the stateDir refuses writes
        self.last_flush_at: float | None = None
        self.last_error: str | None = None

    # ---- the sink protocols ---------------------------------------------------------------------------------
    def fingerprint(self) -> Hashable:
        c = self.config
        allow = tuple(sorted(self.windows.allow))
        return ("history", c.interval_minutes, c.retention_days, allow, self.path, self.node)

    def attach(self, bus: EventBus) -> None:
        """No bus subscription: history reads snapshots, not events (an unread channel would only count drops)."""

    def close(self) -> None:
        """Nothing to let go of: the store is closed by the task's own final flush."""

    def take_over(self, old: object) -> None:
        """Replacing ``old`` (after its final flush, before this one's task starts): its counters carry on, and the
        windows it still holds in memory (samples ingested since that flush, or windows a refused flush kept) are
        this one's to write, of the metrics it keeps, when the window length is the same."""
        if not isinstance(old, HistorySink):
            return
        self.points_written += old.points_written
        self.flushes += old.flushes
        self.quarantined += old.quarantined
        self.windows.non_finite += old.windows.non_finite
        held = old.windows.take_all()
        if old.windows.interval == self.windows.interval:
            self.windows.restore((key, acc) for key, acc in held if key[0][0] in self.windows.allow)
        elif held:
            log.info("history: %d window(s) in progress dropped: the window length changed", len(held))
        self._note_change()

    def ingest(self, snap: TierSnapshot) -> None:
        """Accumulate the allowlisted samples of ``snap`` (in memory, in the tier loop's task); the task writes them."""
        self.windows.ingest(snap.samples, snap.collected_at)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        import sqlite3  # here, not at the top: an agent without history never loads it

        from nvdaemon.history.store import open_store

        self.store, moved = await trio.to_thread.run_sync(open_store, self.path, limiter=self.limiter)
        self.quarantined += moved
        try:
            pending, stats = await self._call(lambda s: (s.take_pending(), s.stats()))
            self.windows.restore(pending)
            self._set_stats(stats)
            task_status.started()
            interval = self.windows.interval
            while True:
                now = self.wall()
                await trio.sleep(max(0.0, window_end(now, interval) + SETTLE_SECONDS - now))
                try:
                    await self.flush()
                except (sqlite3.OperationalError, OSError) as exc:
                    # A full or read-only stateDir: the windows stay in memory and the next window's flush writes
                    # them too. A task restart would only fail the same way, and log a traceback each time.
                    if self.flushes_refused == 0:
                        log.error("history: windows not written (%s); kept in memory and retried", exc)
                    self.flushes_refused += 1
                    continue
                if self.flushes_refused:
                    log.info("history: windows written again after %d refused flush(es)", self.flushes_refused)
                    self.flushes_refused = 0
        finally:
            with bounded_shield(FINAL_FLUSH_SECONDS):
                try:
                    await self.flush(final=True)
                except Exception as exc:  # the stop goes on; the windows stay in memory for a restart
                    log.warning("history: final flush failed: %s", exc)
                # Past the deadline (a flush abandoned in its thread) this is cancelled before it starts: the
                # connection then closes when that thread drops the last reference to the store.
                await self._call(self._close, abandon=True)
            self.store = None

    # ---- flushing -------------------------------------------------------------------------------------------
    async def flush(self, final: bool = False) -> int:
        """Write every window that has ended; with ``final`` also save the windows in progress as pending."""
        now = self.wall()
        done = self.windows.take_complete(now)
        pending = self.windows.take_all() if final else []
        prune_before = int(now) - self.config.retention_days * 86400
        try:
            written, stats = await self._call(
                lambda s: (s.write(done, prune_before, pending), s.stats()), abandon=final
            )
        except BaseException as exc:
            self.windows.restore(done)
            self.windows.restore(pending)
            if not isinstance(exc, trio.Cancelled):
                self.last_error = f"{type(exc).__name__}: {exc}"
            raise
        self.points_written += written
        self.flushes += 1
        self.last_flush_at = now
        self.last_error = None
        if written:
            self._note_change()
        self._set_stats(stats)
        return written

    def _set_stats(self, stats: tuple[int, int]) -> None:
        if stats != (self.series, self.db_bytes):
            self.series, self.db_bytes = stats
            self._note_change()

    # ---- queries --------------------------------------------------------------------------------------------
    async def query(self, metric: str, q: Query, limit: int = MAX_POINTS) -> QueryResult:
        from nvdaemon.history.store import QueryResult

        if q.node is not None and q.node != self.node:
            return QueryResult()  # one node per file: another node's series are not here
        return await self._call(lambda s: s.query(metric, q.device, q.since, q.step, limit))

    # ---- the store, in a worker thread ----------------------------------------------------------------------
    async def _call(self, fn: Callable[[HistoryStore], T], abandon: bool = False) -> T:
        if self.store is None:
            raise Unavailable("history store not open")
        return await trio.to_thread.run_sync(
            functools.partial(self._guarded, fn), limiter=self.limiter, abandon_on_cancel=abandon
        )

    def _guarded(self, fn: Callable[[HistoryStore], T]) -> T:
        """Run ``fn`` on the store (worker thread); a store sqlite finds corrupt is moved aside, a fresh one opened
        and ``fn`` run once more on it."""
        import sqlite3

        from nvdaemon.history.store import HistoryStore, is_corrupt
        from nvdaemon.statefile import quarantine_db

        store = self.store
        if store is None:
            raise Unavailable("history store not open")
        try:
            return fn(store)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            store.close()
            quarantine_db(self.path, str(exc))
            self.quarantined += 1
            self.store = store = HistoryStore(self.path)
            return fn(store)

    def _close(self, store: HistoryStore) -> None:
        self.store = None  # in the thread, under the limiter: no call queued behind this one sees a closed file
        store.close()

    # ---- observability --------------------------------------------------------------------------------------
    def metrics(self) -> Iterable[Metric]:
        written = CounterMetricFamily(
            "nodevitals_history_points_written", "History points written (new or merged) since start."
        )
        written.add_metric([], self.points_written)
        series = GaugeMetricFamily("nodevitals_history_series", "Series in the history store.")
        series.add_metric([], self.series)
        size = GaugeMetricFamily("nodevitals_history_db_bytes", "Size of the history store on disk (file and WAL).")
        size.add_metric([], self.db_bytes)
        return (written, series, size)

    def dropped_counts(self) -> dict[str, int]:
        """Nothing is dropped by reason: a refused flush keeps its windows, non-finite samples are in ``state``."""
        return {}

    def degraded(self) -> str | None:
        return None  # a refused flush is ``lastError`` in ``state``; the task goes on

    def state_writable(self) -> bool | None:
        return None

    def state(self) -> dict[str, Any]:
        return {
            "open": self.store is not None,
            "intervalMinutes": self.config.interval_minutes,
            "retentionDays": self.config.retention_days,
            "metrics": sorted(self.windows.allow),
            "series": self.series,
            "pointsWritten": self.points_written,
            "dbBytes": self.db_bytes,
            "openWindows": len(self.windows.open),
            "skippedNonFinite": self.windows.non_finite,
            "flushes": self.flushes,
            "lastFlushAt": self.last_flush_at,
            "lastError": self.last_error,
            "quarantined": self.quarantined,
        }


def history_path(config: HistoryConfig, state_dir: Path) -> Path:
    """``history.dataDir`` (the Go agent's key) when set, else the state directory, holds the database."""
    data_dir = config.data_dir
    return Path(data_dir) / HISTORY_FILE_IN_DATA_DIR if data_dir else state_dir / "history.db"
