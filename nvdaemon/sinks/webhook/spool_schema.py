"""The spool file's tables (``stateDir/spool.db``), its rows, and the migration of files written by older agents.

Table ``spool``, one row per event an endpoint must deliver: ``enqueued`` is the wall-clock time (seconds since the
epoch) the event was spooled or re-queued by ``nvdaemon spool retry``, shown to people; ``boot_id`` and
``boottime`` stamp the same moment on a clock that does not step (``nvdaemon.sinks.spool_clock``), and are what an
event's age (``maxAgeHours``, the delivery latency) is measured on. Table ``endpoints``: endpoints a 410 disabled.

Migration: files from before the stamp lack its two columns. They are added (``ALTER TABLE ... ADD COLUMN``, NULL
for the rows already there, whose age then comes from the wall clock) when the file is opened, or, where the
stateDir refuses writes then, before the first write that goes through; until then the rows read with the stamp
NULL, so a read-only spool can still be listed and delivered from.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from nvdaemon.sinks.spool_clock import SteadyClock
from nvdaemon.sqlitetx import transaction

SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  endpoint TEXT NOT NULL,
  event_id TEXT NOT NULL,
  severity INTEGER NOT NULL,
  enqueued REAL NOT NULL,
  state INTEGER NOT NULL DEFAULT 0,
  attempts INTEGER NOT NULL DEFAULT 0,
  last_error TEXT,
  dead_reason TEXT,
  body BLOB NOT NULL,
  boot_id TEXT,
  boottime REAL,
  UNIQUE (endpoint, event_id)
);
CREATE INDEX IF NOT EXISTS spool_head ON spool (endpoint, state, seq);
CREATE INDEX IF NOT EXISTS spool_evict ON spool (endpoint, state, severity, seq);
CREATE TABLE IF NOT EXISTS endpoints (
  endpoint TEXT PRIMARY KEY,
  disabled_url TEXT NOT NULL,
  disabled_at REAL NOT NULL,
  reason TEXT NOT NULL
);
"""
STAMP = (("boot_id", "TEXT"), ("boottime", "REAL"))  # added after the first release: migrated, nullable
COLUMNS = (
    "seq, endpoint, event_id, severity, enqueued, state, attempts, last_error, dead_reason, body, boot_id, boottime"
)
LEGACY_COLUMNS = COLUMNS.replace("boot_id, boottime", "NULL, NULL")  # the same rows from a file not yet migrated
# sqlite primary result codes for "this file cannot be written now" (https://sqlite.org/rescode.html)
_REFUSED = {3, 5, 6, 8, 10, 13, 14}  # PERM, BUSY, LOCKED, READONLY, IOERR, FULL, CANTOPEN


@dataclass(frozen=True)
class Row:
    seq: int
    endpoint: str
    event_id: str
    severity: int
    enqueued: float
    state: int
    attempts: int
    last_error: str | None
    dead_reason: str | None
    body: bytes
    boot_id: str | None = None
    boottime: float | None = None

    def age(self, clock: SteadyClock, wall_now: float) -> float:
        """Seconds since the event was spooled (or re-queued), never negative: see ``SteadyClock.age``."""
        return clock.age(wall_now, self.enqueued, self.boot_id, self.boottime)


def missing_stamp(db: sqlite3.Connection) -> bool:
    have = {str(r[1]) for r in db.execute("PRAGMA table_info(spool)")}
    return any(name not in have for name, _ in STAMP)


def migrate(db: sqlite3.Connection) -> None:
    """Add the stamp columns a file from an older agent lacks, in one transaction (raises what the write raises)."""

    def work() -> None:
        have = {str(r[1]) for r in db.execute("PRAGMA table_info(spool)")}
        for name, kind in STAMP:
            if name not in have:
                db.execute(f"ALTER TABLE spool ADD COLUMN {name} {kind}")

    transaction(db, work)


def try_migrate(db: sqlite3.Connection) -> bool:
    """``migrate`` if needed; False when the file cannot be written now (read-only, full, locked), so it stays as it
    is and is read with ``LEGACY_COLUMNS``. Any other error (a damaged file) propagates."""
    if not missing_stamp(db):
        return True
    try:
        migrate(db)
    except sqlite3.OperationalError as exc:
        if (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF in _REFUSED:
            return False
        raise
    return True
