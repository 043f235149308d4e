"""``stateDir/history.db``: one sqlite file in WAL mode, synchronous (the service calls it from worker threads).

Layout: ``series`` (id, metric, device, labels as JSON, quantum) and ``points`` keyed by (series, minute) WITHOUT
ROWID, so the table is its own index; each point holds the average in quanta and the distances to the minimum and
maximum (see ``core``). ``pending`` holds the windows in progress across a graceful restart: written by the final
flush, read back (and emptied) on open.

A write is one transaction: new points (a point already there, from a sample that arrived after its window was
written, is merged: minimum and maximum exact, average the mean of the two), retention pruning per series (an index
range each, never a table scan), and the pending windows. A file sqlite calls corrupt or not a database, at open or
later, is moved aside and a fresh one started.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from nvdaemon.history.core import (
    Acc,
    Point,
    SeriesKey,
    TooManyPoints,
    WindowKey,
    buckets_between,
    decode_point,
    downsample,
    encode_point,
    first_minute,
    from_minutes,
    quantum_for,
    to_minutes,
)
from nvdaemon.sqlitetx import transaction
from nvdaemon.statefile import ensure_dir, quarantine_db

log = logging.getLogger(__name__)

FILE = "history.db"
VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
  id INTEGER PRIMARY KEY,
  metric TEXT NOT NULL,
  device TEXT NOT NULL,
  labels TEXT NOT NULL,
  quantum INTEGER NOT NULL,
  UNIQUE (metric, device, labels)
);
CREATE TABLE IF NOT EXISTS points (
  s INTEGER NOT NULL,
  t INTEGER NOT NULL,
  a INTEGER NOT NULL,
  lo INTEGER NOT NULL,
  hi INTEGER NOT NULL,
  PRIMARY KEY (s, t)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pending (
  s INTEGER NOT NULL,
  w INTEGER NOT NULL,
  n INTEGER NOT NULL,
  total REAL NOT NULL,
  lo REAL NOT NULL,
  hi REAL NOT NULL,
  PRIMARY KEY (s, w)
) WITHOUT ROWID;
"""

_UPSERT = """
INSERT INTO points (s, t, a, lo, hi) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (s, t) DO UPDATE SET
  lo = (a + excluded.a) / 2 - min(a - lo, excluded.a - excluded.lo),
  hi = max(a + hi, excluded.a + excluded.hi) - (a + excluded.a) / 2,
  a = (a + excluded.a) / 2
"""

_CORRUPT = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
_UNREADABLE = {10, 14, 23}  # SQLITE_IOERR, SQLITE_CANTOPEN, SQLITE_AUTH: only when opening


def is_corrupt(exc: sqlite3.DatabaseError, opening: bool = False) -> bool:
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    if code in _CORRUPT or (opening and code in _UNREADABLE):
        return True
    text = str(exc)
    return "malformed" in text or "not a database" in text


@dataclass
class SeriesResult:
    device: str
    labels: dict[str, str]
    points: list[Point]


@dataclass
class QueryResult:
    series: list[SeriesResult] = field(default_factory=list)


class HistoryStore:
    def __init__(self, path: Path) -> None:
        ensure_dir(path.parent)
        self.path = path
        self.db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version > VERSION:
                _newer(version)
            self.db.executescript(_SCHEMA)
            self.db.execute(f"PRAGMA user_version={VERSION}")
            self.ids: dict[SeriesKey, tuple[int, int]] = {}
            for sid, metric, device, labels, q in self.db.execute(
                "SELECT id, metric, device, labels, quantum FROM series"
            ):
                key = (metric, device, tuple(sorted(msgspec.json.decode(labels, type=dict[str, str]).items())))
                self.ids[key] = (sid, q)
        except BaseException:
            self.db.close()
            raise
        path.chmod(0o600)

    def close(self) -> None:
        self.db.close()

    def _series(self, key: SeriesKey) -> tuple[int, int]:
        known = self.ids.get(key)
        if known is not None:
            return known
        metric, device, labels = key
        q = quantum_for(metric)
        cur = self.db.execute(
            "INSERT INTO series (metric, device, labels, quantum) VALUES (?, ?, ?, ?)",
            (metric, device, msgspec.json.encode(dict(labels)).decode(), q),
        )
        sid = cur.lastrowid
        assert sid is not None
        self.ids[key] = (sid, q)
        return sid, q

    # ---- writes ---------------------------------------------------------------------------------------------
    def write(
        self,
        windows: Sequence[tuple[WindowKey, Acc]],
        prune_before: int | None = None,
        pending: Sequence[tuple[WindowKey, Acc]] = (),
    ) -> int:
        """Write complete windows as points, prune points stamped before ``prune_before`` (unix seconds) and
        replace the pending windows, in one transaction. Returns the points written (new or merged)."""
        known = dict(self.ids)

        def work() -> int:
            rows = []
            for (key, end), acc in windows:
                sid, q = self._series(key)
                rows.append((sid, to_minutes(end), *encode_point(acc, q)))
            written = self.db.executemany(_UPSERT, rows).rowcount if rows else 0
            if prune_before is not None:
                cutoff = first_minute(prune_before)
                self.db.executemany(
                    "DELETE FROM points WHERE s = ? AND t < ?", [(sid, cutoff) for sid, _ in self.ids.values()]
                )
            self.db.execute("DELETE FROM pending")
            if pending:
                self.db.executemany(
                    "INSERT INTO pending VALUES (?, ?, ?, ?, ?, ?)",
                    [(self._series(key)[0], end, *acc.as_tuple()) for (key, end), acc in pending],
                )
            return max(written, 0)

        try:
            return transaction(self.db, work)
        except BaseException:
            self.ids = known  # series rows of a rolled-back transaction do not exist
            raise

    def take_pending(self) -> list[tuple[WindowKey, Acc]]:
        """The windows in progress the previous run saved; removed from the file (they live in memory now)."""
        by_id = {sid: key for key, (sid, _) in self.ids.items()}

        def work() -> list[tuple[WindowKey, Acc]]:
            rows = self.db.execute("SELECT s, w, n, total, lo, hi FROM pending").fetchall()
            self.db.execute("DELETE FROM pending")
            return [((by_id[s], w), Acc(n, total, lo, hi)) for s, w, n, total, lo, hi in rows if s in by_id]

        return transaction(self.db, work)

    # ---- reads ----------------------------------------------------------------------------------------------
    def query(self, metric: str, device: str | None, since: int | None, step: int | None, limit: int) -> QueryResult:
        """Points of ``metric`` (optionally one device) stamped at or after ``since``, oldest first, re-downsampled
        to ``step`` seconds; ``TooManyPoints`` before anything is read when the answer would exceed ``limit``."""
        sql = "SELECT id, device, labels, quantum FROM series WHERE metric = ?"
        args: list[Any] = [metric]
        if device is not None:
            sql += " AND device = ?"
            args.append(device)
        chosen = self.db.execute(sql + " ORDER BY device, labels", args).fetchall()
        t0 = -(2**62) if since is None else first_minute(since)
        spans = []
        total = 0
        for sid, *_ in chosen:
            n, first, last = self.db.execute(
                "SELECT COUNT(*), MIN(t), MAX(t) FROM points WHERE s = ? AND t >= ?", (sid, t0)
            ).fetchone()
            spans.append(n)
            if n:
                total += min(n, buckets_between(from_minutes(first), from_minutes(last), step))
        if total > limit:
            raise TooManyPoints(total, limit)
        result = QueryResult()
        for (sid, dev, labels, q), n in zip(chosen, spans, strict=True):
            if not n:
                continue
            rows = self.db.execute("SELECT t, a, lo, hi FROM points WHERE s = ? AND t >= ? ORDER BY t", (sid, t0))
            points = (decode_point(t, a, lo, hi, q) for t, a, lo, hi in rows)
            result.series.append(
                SeriesResult(
                    device=dev,
                    labels=msgspec.json.decode(labels, type=dict[str, str]),
                    points=list(downsample(points, step) if step else points),
                )
            )
        return result

    def stats(self) -> tuple[int, int]:
        """(series, bytes on disk: the file and its WAL)."""
        size = 0
        for p in (self.path, self.path.with_name(self.path.name + "-wal")):
            with contextlib.suppress(FileNotFoundError):
                size += p.stat().st_size
        return len(self.ids), size

    def point_count(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM points").fetchone()[0])


def _newer(version: int) -> None:
    raise sqlite3.DatabaseError(f"file is not a database of this version (user_version {version})")


def open_store(path: Path) -> tuple[HistoryStore, bool]:
    """Open ``path``; one that is corrupt or unreadable is moved aside and a fresh one started. Returns the store
    and whether that happened."""
    try:
        return HistoryStore(path), False
    except sqlite3.DatabaseError as exc:
        if not is_corrupt(exc, opening=True):
            raise
        quarantine_db(path, str(exc))
        return HistoryStore(path), True
