"""The durable webhook spool: one sqlite file, ``stateDir/spool.db``, in WAL mode.

Layout: each endpoint keeps its own copy of every event it must deliver (table ``spool``, keyed by the endpoint id,
which is the sink name). A copy per endpoint costs bytes but buys isolation: one dead receiver can fill only its own
share, never evict what a healthy receiver still has to get, and each endpoint's cursor is simply its oldest pending
row. ``spool.maxEvents`` and ``spool.maxBytes`` therefore bound each endpoint's share (pending and dead letters).

Durability: an ingest batch is committed with ``synchronous=FULL`` before the sink takes the next event off the bus.
Delivery bookkeeping (delete on 2xx, attempt counts) commits at ``NORMAL``, deletes batched (``forget``: the sender
forgets what it delivered of its read-ahead in one transaction): a crash can lose at most that bookkeeping, which
shows up as a duplicate delivery, never as a lost event.

Overflow order when a share is over a bound: dead letters first (oldest first), then pending events of the lowest
severity (info, then warning, then critical), oldest first within a severity. ``add`` returns the dropped events'
ids by reason, ``spool_full_events`` or ``spool_full_bytes``, for the caller to count and log.

``SpoolDB`` is synchronous (the CLI uses it directly). ``spool_io.Spool`` wraps it for trio (worker
threads, one at a time), turns a full or read-only stateDir into ``SpoolUnwritable`` and moves a damaged file aside.
Rows are addressed by ``(seq, event_id)``: after a damaged spool was replaced by a fresh one, a seq held from the old
file can never touch another event in the new one.

The tables, their rows and the migration of older files are in ``spool_schema``. Each row is stamped
on the wall clock (shown to people) and on a clock that does not step (``nvdaemon.sinks.spool_clock``), which is
what its age is measured on.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nvdaemon.sinks.spool_clock import system_clock
from nvdaemon.sinks.webhook.spool_schema import COLUMNS, LEGACY_COLUMNS, SCHEMA, Row, migrate, try_migrate
from nvdaemon.sqlitetx import transaction
from nvdaemon.statefile import ensure_dir

__all__ = ["DEAD", "FILE", "PENDING", "Drops", "Row", "Share", "SpoolDB", "held_ids"]

FILE = "spool.db"
PENDING, DEAD = 0, 1
SQLITE_FULL = 13  # https://sqlite.org/rescode.html
T = TypeVar("T")
Drops = dict[str, list[str]]  # reason -> ids of the events dropped for it
LOW_SPACE = 16 * 1024 * 1024  # bytes free in stateDir below which every write is followed by a checkpoint
WAL_PAGES = 10  # pages one small transaction writes to the WAL, at most (the table, three indexes, the sequence)
WRITE_COST = 4  # disk bytes a transaction may take per byte of event added, at most (WAL, indexes, checkpoint)
BUSY_TIMEOUT_MS = 30_000


@dataclass
class Share:
    """One endpoint's part of the spool, cached so bounds checks never scan the table."""

    pending: int = 0
    dead: int = 0
    bytes: int = 0

    @property
    def events(self) -> int:
        return self.pending + self.dead


class SpoolDB:
    def __init__(self, path: Path) -> None:
        ensure_dir(path.parent)
        self.path = path
        self.db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.executescript(SCHEMA)
            self._columns = COLUMNS if try_migrate(self.db) else LEGACY_COLUMNS
            if path.stat().st_mode & 0o777 != 0o600:  # only when needed: a read-only stateDir may still be read
                path.chmod(0o600)
        except BaseException:
            self.db.close()  # a damaged file or a stateDir that refuses writes: no connection left behind
            raise
        self._shares: dict[str, Share] = {}

    def close(self) -> None:
        self.db.close()

    def _tx(self, sync: str, fn: Callable[[], T]) -> T:
        """``fn`` in one write transaction; the cached shares it changed are put back when that rolls back (a full
        disk fails the COMMIT itself, after ``fn`` counted its deletes: a retried delete must not count twice)."""
        saved = {endpoint: (sh.pending, sh.dead, sh.bytes) for endpoint, sh in self._shares.items()}
        self.db.execute(f"PRAGMA synchronous={sync}")
        if self._columns == LEGACY_COLUMNS:  # a file from an older agent, not migrated when opened: now or never
            migrate(self.db)
            self._columns = COLUMNS
        try:
            result = transaction(self.db, fn)
        except BaseException:
            for endpoint, sh in list(self._shares.items()):
                if endpoint in saved:
                    sh.pending, sh.dead, sh.bytes = saved[endpoint]
                else:
                    del self._shares[endpoint]
            raise
        if self.free_space() < LOW_SPACE:
            with contextlib.suppress(sqlite3.Error):  # committed all the same; the next write tries again
                self.checkpoint()
        return result

    def _room_for(self, items: Sequence[tuple[str, int, bytes]]) -> bool:
        """Whether adding ``items`` leaves the room that deleting delivered events needs.

        Refused before writing, because new events must never take the last bytes: without them a delete could not
        be written (nor the checkpoint that gives the WAL's space back, see ``checkpoint``) and the spool could not
        even shrink. The WAL needs real free space for the transaction's pages (WAL_PAGES of tree pages, plus the
        events at WRITE_COST bytes per byte) and gives it back at the checkpoint; the file grows by at most as much
        (page splits), less what the pages freed by earlier deliveries can hold. What is left after that growth must
        still hold such a transaction, so the next one (or a delete, which needs less) always fits."""
        free = self.free_space()
        if free >= LOW_SPACE:
            return True
        page = self._pragma("page_size")
        written = WAL_PAGES * page + WRITE_COST * sum(len(body) for _, _, body in items)
        growth = max(0, written - self._pragma("freelist_count") * page)  # page splits: every page may be new
        return free - growth >= written  # so the next transaction of this size, or a delete, still fits

    def _pragma(self, name: str) -> int:
        return int(self.db.execute(f"PRAGMA {name}").fetchone()[0])

    def free_space(self) -> float:
        """Bytes free for this process in the stateDir's filesystem (a statvfs: microseconds); inf if unknown."""
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return float("inf")
        return float(st.f_bavail * st.f_frsize)

    def share(self, endpoint: str, refresh: bool = False) -> Share:
        sh = self._shares.get(endpoint)
        if sh is None or refresh:
            sh = Share()
            for state, n, size in self.db.execute(
                "SELECT state, COUNT(*), COALESCE(SUM(length(body)), 0) FROM spool WHERE endpoint = ? GROUP BY state",
                (endpoint,),
            ):
                sh.bytes += size
                if state == PENDING:
                    sh.pending = n
                else:
                    sh.dead += n
            self._shares[endpoint] = sh
        return sh

    def checkpoint(self) -> None:
        """Copy the WAL into the database file and cut the WAL to nothing, giving its space back. Never waits for
        a reader (the CLI): with one, nothing happens.

        Why: sqlite checkpoints on its own only once the WAL holds 1000 pages (4 MiB). On a disk with less room than
        that, the WAL takes every byte left, and then nothing can be written, not even the checkpoint that would
        free it, since the database file must grow to take the pages. So with little space left the spool
        checkpoints after every write (and after a write refused for space), while the database can still grow.
        """
        self.db.execute("PRAGMA busy_timeout=0")
        try:
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            self.db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")

    def cached_share(self, endpoint: str) -> Share | None:
        """The share as last counted, without touching the file (a dict read: safe from the trio thread)."""
        return self._shares.get(endpoint)

    def cached_shares(self) -> dict[str, Share]:
        """Every share counted so far, without touching the file (it may be damaged). Under the limiter only."""
        return dict(self._shares)

    # ---- ingest ---------------------------------------------------------------------------------------------
    def add(
        self,
        endpoint: str,
        items: Sequence[tuple[str, int, bytes]],
        max_events: int,
        max_bytes: int,
        now: float | None = None,
        stamp: tuple[str, float] | None = None,
    ) -> Drops:
        """Commit ``(event_id, severity, body)`` items durably, then enforce the bounds; return the dropped events'
        ids by reason (dead letters among them were counted when they died, so only pending ones are listed).
        ``now`` (wall clock, default ``time.time()``) and ``stamp`` (``SteadyClock.stamp()``, default the system's)
        are when they were spooled."""
        sh = self.share(endpoint)
        now = time.time() if now is None else now
        boot_id, boottime = stamp or system_clock().stamp()
        if not self._room_for(items):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def work() -> Drops:
            for event_id, severity, body in items:
                cur = self.db.execute(
                    "INSERT OR IGNORE INTO spool (endpoint, event_id, severity, enqueued, boot_id, boottime, body) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (endpoint, event_id, severity, now, boot_id, boottime, body),
                )
                if cur.rowcount:
                    sh.pending += 1
                    sh.bytes += len(body)
            drops: Drops = {}
            if sh.events > max_events:
                drops["spool_full_events"] = self._evict(endpoint, sh, lambda: sh.events > max_events)
            if sh.bytes > max_bytes:
                drops["spool_full_bytes"] = self._evict(endpoint, sh, lambda: sh.bytes > max_bytes)
            return drops

        return self._tx("FULL", work)

    def _evict(self, endpoint: str, sh: Share, over: Callable[[], bool]) -> list[str]:
        victims = self.db.execute(
            "SELECT seq, state, length(body), event_id FROM spool WHERE endpoint = ? "
            "ORDER BY state DESC, severity, seq",
            (endpoint,),
        )
        gone: list[tuple[int]] = []
        pending: list[str] = []
        for seq, state, size, event_id in victims:
            if not over():
                break
            gone.append((seq,))
            sh.bytes -= size
            if state == PENDING:
                sh.pending -= 1
                pending.append(event_id)
            else:
                sh.dead -= 1
        victims.close()
        self.db.executemany("DELETE FROM spool WHERE seq = ?", gone)
        return pending

    # ---- delivery -------------------------------------------------------------------------------------------
    def head(self, endpoint: str) -> Row | None:
        """The oldest pending event of ``endpoint``: its cursor."""
        r = self.db.execute(
            f"SELECT {self._columns} FROM spool WHERE endpoint = ? AND state = {PENDING} ORDER BY seq LIMIT 1",
            (endpoint,),
        ).fetchone()
        return Row(*r) if r else None

    def heads(self, endpoint: str, limit: int) -> list[Row]:
        """The endpoint's ``limit`` oldest pending events, oldest first (the sender's read-ahead)."""
        if limit <= 0:
            return []
        cur = self.db.execute(
            f"SELECT {self._columns} FROM spool WHERE endpoint = ? AND state = {PENDING} ORDER BY seq LIMIT ?",
            (endpoint, limit),
        )
        return [Row(*r) for r in cur]

    def delivered(self, endpoint: str, seq: int, event_id: str) -> Row | None:
        """Forget a delivered event; return the endpoint's next pending one (the sender's next read)."""
        rows = self.forget(endpoint, [(seq, event_id)], 1)
        return rows[0] if rows else None

    def forget(self, endpoint: str, done: Sequence[tuple[int, str]], limit: int) -> list[Row]:
        """Forget delivered events ``(seq, event_id)``, all in one transaction (one WAL append, not one per event);
        return the endpoint's next ``limit`` pending ones (``heads``)."""
        sh = self.share(endpoint)

        def work(items: Sequence[tuple[int, str]]) -> None:
            for seq, event_id in items:
                r = self.db.execute(
                    "DELETE FROM spool WHERE seq = ? AND event_id = ? RETURNING length(body)", (seq, event_id)
                ).fetchone()
                if r is not None:
                    sh.pending -= 1
                    sh.bytes -= r[0]

        try:
            if done:
                self._tx("NORMAL", lambda: work(done))
        except (sqlite3.Error, OSError) as exc:
            if len(done) == 1 or not _out_of_space(exc):
                raise
            # The room ``_room_for`` keeps free holds one delete's transaction, not a batch's: on a full disk the
            # batch may not fit where each delete does, and only deletes make room.
            for item in done:
                self._tx("NORMAL", functools.partial(work, [item]))
        return self.heads(endpoint, limit)

    def attempted(self, seq: int, event_id: str, attempts: int, error: str) -> None:
        self._tx(
            "NORMAL",
            lambda: self.db.execute(
                "UPDATE spool SET attempts = ?, last_error = ? WHERE seq = ? AND event_id = ?",
                (attempts, error, seq, event_id),
            ),
        )

    def bury(self, endpoint: str, seq: int, event_id: str, attempts: int, reason: str, error: str) -> bool:
        """Make a pending event a dead letter: kept for ``nvdaemon spool list`` / ``retry``, no longer sent. False when
        the event was not (or no longer) pending."""
        sh = self.share(endpoint)

        def work() -> bool:
            cur = self.db.execute(
                f"UPDATE spool SET state = {DEAD}, attempts = ?, dead_reason = ?, last_error = ? "
                f"WHERE seq = ? AND event_id = ? AND state = {PENDING}",
                (attempts, reason, error, seq, event_id),
            )
            if cur.rowcount:
                sh.pending -= 1
                sh.dead += 1
            return bool(cur.rowcount)

        return self._tx("NORMAL", work)

    # ---- endpoints disabled by 410 --------------------------------------------------------------------------
    def disabled(self, endpoint: str, url_hash: str) -> str | None:
        r = self.db.execute(
            "SELECT reason FROM endpoints WHERE endpoint = ? AND disabled_url = ?", (endpoint, url_hash)
        ).fetchone()
        return str(r[0]) if r else None

    def disable(self, endpoint: str, url_hash: str, reason: str) -> None:
        self._tx(
            "FULL",
            lambda: self.db.execute(
                "INSERT OR REPLACE INTO endpoints VALUES (?, ?, ?, ?)", (endpoint, url_hash, time.time(), reason)
            ),
        )

    # ---- inspection (CLI) -----------------------------------------------------------------------------------
    def rows(self, state: int | None = None) -> list[Row]:
        where = "" if state is None else f"WHERE state = {int(state)}"
        return [Row(*r) for r in self.db.execute(f"SELECT {self._columns} FROM spool {where} ORDER BY endpoint, seq")]

    def disabled_endpoints(self) -> list[tuple[str, float, str]]:
        return [
            (str(a), float(b), str(c))
            for a, b, c in self.db.execute("SELECT endpoint, disabled_at, reason FROM endpoints")
        ]

    def retry(
        self, event_ids: Sequence[str] = (), now: float | None = None, stamp: tuple[str, float] | None = None
    ) -> int:
        """Dead letters (all, or those with the given event ids) become pending again, with a fresh age (stamped as
        ``add`` stamps it) and no attempts; endpoints disabled by a 410 are enabled again. Returns how many events
        were revived."""
        boot_id, boottime = stamp or system_clock().stamp()

        def work() -> int:
            sql = (
                f"UPDATE spool SET state = {PENDING}, attempts = 0, dead_reason = NULL, enqueued = ?, boot_id = ?, "
                f"boottime = ? WHERE state = {DEAD}"
            )
            args: list[Any] = [time.time() if now is None else now, boot_id, boottime]
            if event_ids:
                sql += f" AND event_id IN ({','.join('?' * len(event_ids))})"
                args += list(event_ids)
            n = self.db.execute(sql, args).rowcount
            self.db.execute("DELETE FROM endpoints")
            return int(n)

        n = self._tx("FULL", work)
        self._shares.clear()
        return n


def _out_of_space(exc: BaseException) -> bool:
    """sqlite's SQLITE_FULL (13, also in an extended code's low byte), or the filesystem's ENOSPC / EDQUOT."""
    if isinstance(exc, sqlite3.Error):
        return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def held_ids(path: Path) -> dict[str, list[str]] | None:
    """The pending events' ids per endpoint in a (moved-aside, possibly damaged) spool file, read without changing
    it; None when they cannot all be read."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
    except sqlite3.Error:
        return None
    try:
        held: dict[str, list[str]] = {}
        for endpoint, event_id in db.execute(f"SELECT endpoint, event_id FROM spool WHERE state = {PENDING}"):
            held.setdefault(str(endpoint), []).append(str(event_id))
        return held
    except sqlite3.Error:
        return None
    finally:
        db.close()
