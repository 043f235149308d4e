"""A spool file written by an older agent (no steady-clock stamp on its rows) is migrated when opened: the two
columns are added, its rows keep their events and are aged on the wall clock, new rows are stamped. Where the file
cannot be written at that moment (another writer holds it) it is read as it is and migrated by the first write."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import msgspec
import pytest
import trio
import trio.testing

from nvdaemon.sinks.webhook import spool
from nvdaemon.sinks.webhook.spool import DEAD, FILE, SpoolDB

from .helpers import Script, event, hook, running, until

URL = "https://receiver.example:8443/hooks/hw"
T0 = 1_700_000_000.0
NAME = "webhook:test"

# The table as agents before the steady-clock stamp created it.
OLD_SCHEMA = """
CREATE TABLE spool (
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
  UNIQUE (endpoint, event_id)
);
CREATE INDEX spool_head ON spool (endpoint, state, seq);
CREATE INDEX spool_evict ON spool (endpoint, state, severity, seq);
CREATE TABLE endpoints (
  endpoint TEXT PRIMARY KEY,
  disabled_url TEXT NOT NULL,
  disabled_at REAL NOT NULL,
  reason TEXT NOT NULL
);
"""


def old_spool(path: Path, rows: list[tuple[int, float, int]]) -> None:
    """A spool file as an older agent left it: ``(event seq, wall-clock enqueue time, state)`` rows of ``NAME``."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(OLD_SCHEMA)
    for i, enqueued, state in rows:
        db.execute(
            "INSERT INTO spool (endpoint, event_id, severity, enqueued, state, body) VALUES (?, ?, 1, ?, ?, ?)",
            (NAME, event(i).id, enqueued, state, msgspec.json.encode(event(i))),
        )
    db.close()


def columns(path: Path) -> set[str]:
    db = sqlite3.connect(path)
    try:
        return {str(r[1]) for r in db.execute("PRAGMA table_info(spool)")}
    finally:
        db.close()


async def test_an_old_spool_is_migrated_its_rows_aged_on_the_wall_clock_and_delivered(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    path = tmp_path / FILE
    # Event 1 was spooled 2 h ago, event 2 a minute ago (wall clock: all an old row has); event 4 is a dead letter.
    old_spool(path, [(1, T0 - 2 * 3600, 0), (2, T0 - 60, 0), (4, T0 - 60, DEAD)])
    script = Script(lambda seq, n: httpx.Response(200))
    wall = lambda: T0 + trio.current_time()  # noqa: E731
    async with running(tmp_path, hook(URL, maxAgeHours=1), transport=script.transport(), wall=wall) as (sink, bus):
        bus.publish(event(3))
        await until(lambda: script.delivered == [2, 3], timeout=100)
        assert sink.dropped == {"expired": 1}  # event 1: older than maxAgeHours on the wall clock
    assert {"boot_id", "boottime"} <= columns(path)
    stamps = {r.event_id: (r.boot_id, r.boottime is not None) for r in SpoolDB(path).rows()}
    assert stamps == {event(1).id: (None, False), event(4).id: (None, False)}  # old rows: no stamp made up


def test_an_old_spool_locked_by_another_writer_is_read_as_it_is_then_migrated_by_the_first_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / FILE
    old_spool(path, [(1, T0, 0)])
    monkeypatch.setattr(spool, "BUSY_TIMEOUT_MS", 50)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # e.g. `nvdaemon spool retry` at that moment
    db = SpoolDB(path)
    try:
        (row,) = db.heads(NAME, 10)
        assert (row.event_id, row.boot_id, row.boottime) == (event(1).id, None, None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            db.add(NAME, [(event(2).id, 1, b"{}")], 100, 1 << 20)  # refused as any write is: nothing changed
        assert "boot_id" not in columns(path) and len(db.rows()) == 1
        other.execute("ROLLBACK")
        db.add(NAME, [(event(2).id, 1, b"{}")], 100, 1 << 20, T0 + 5, ("boot-a", 42.0))
        old, new = db.rows()
        assert (old.boot_id, new.boot_id, new.boottime, new.enqueued) == (None, "boot-a", 42.0, T0 + 5)
        assert {"boot_id", "boottime"} <= columns(path)
    finally:
        db.close()
        other.close()
