"""The sqlite spool: durability across reopen, cursor order, the documented overflow order, dead letters, retry."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from nvdaemon.sinks.webhook.spool import DEAD, PENDING, Share, SpoolDB
from nvdaemon.sqlitetx import transaction

T = TypeVar("T")

INFO, WARNING, CRITICAL = 0, 1, 2
BIG = 10**9


@pytest.fixture
def db(tmp_path: Path) -> SpoolDB:
    return SpoolDB(tmp_path / "spool.db")


def ids(db: SpoolDB, endpoint: str = "a") -> list[str]:
    return [r.event_id for r in db.rows() if r.endpoint == endpoint]


def test_committed_rows_survive_reopen_in_order(tmp_path: Path, db: SpoolDB) -> None:
    db.add("a", [(f"e{i}", WARNING, b"x") for i in range(5)], BIG, BIG)
    db.close()
    again = SpoolDB(tmp_path / "spool.db")
    assert ids(again) == ["e0", "e1", "e2", "e3", "e4"]
    assert again.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    head = again.head("a")
    assert head is not None and head.event_id == "e0"
    again.delivered("a", head.seq, head.event_id)
    head = again.head("a")
    assert head is not None and head.event_id == "e1"
    assert again.share("a").pending == 4


def test_each_endpoint_has_its_own_cursor_and_share(db: SpoolDB) -> None:
    db.add("a", [("e1", INFO, b"x"), ("e2", INFO, b"x")], BIG, BIG)
    db.add("b", [("e1", INFO, b"x"), ("e2", INFO, b"x")], BIG, BIG)
    head = db.head("a")
    assert head is not None
    db.delivered("a", head.seq, head.event_id)
    assert [db.head(e).event_id for e in ("a", "b")] == ["e2", "e1"]  # type: ignore[union-attr]
    # A full share of "b" never evicts anything of "a".
    assert db.add("b", [("e3", INFO, b"x")], 2, BIG) == {"spool_full_events": ["e1"]}
    assert ids(db, "a") == ["e2"] and ids(db, "b") == ["e2", "e3"]


def test_the_same_event_twice_is_stored_once(db: SpoolDB) -> None:
    db.add("a", [("e1", INFO, b"x")], BIG, BIG)
    db.add("a", [("e1", INFO, b"x")], BIG, BIG)
    assert ids(db) == ["e1"] and db.share("a").pending == 1


def test_overflow_drops_dead_letters_then_oldest_lowest_severity(db: SpoolDB) -> None:
    db.add(
        "a",
        [("c1", CRITICAL, b"x"), ("i1", INFO, b"x"), ("w1", WARNING, b"x"), ("i2", INFO, b"x"), ("d1", CRITICAL, b"x")],
        BIG,
        BIG,
    )
    d1 = next(r for r in db.rows() if r.event_id == "d1")
    db.bury("a", d1.seq, d1.event_id, 3, "rejected", "HTTP 400")
    # Bound of 5: one more event drops the dead letter first, even though it is critical. It was counted as a drop
    # when it died, so it is not reported again (emitted = delivered + drops, exactly).
    assert db.add("a", [("w2", WARNING, b"x")], 5, BIG) == {"spool_full_events": []}
    assert ids(db) == ["c1", "i1", "w1", "i2", "w2"]
    # Then info, oldest first; then warning, oldest first; critical last.
    assert db.add("a", [("c2", CRITICAL, b"x")], 5, BIG) == {"spool_full_events": ["i1"]}
    assert ids(db) == ["c1", "w1", "i2", "w2", "c2"]
    assert db.add("a", [("c3", CRITICAL, b"x"), ("c4", CRITICAL, b"x")], 5, BIG) == {"spool_full_events": ["i2", "w1"]}
    assert ids(db) == ["c1", "w2", "c2", "c3", "c4"]
    assert db.add("a", [("i3", INFO, b"x")], 5, BIG) == {"spool_full_events": ["i3"]}
    assert ids(db) == ["c1", "w2", "c2", "c3", "c4"]  # a new info event is itself the lowest and oldest of its kind
    assert db.add("a", [("c5", CRITICAL, b"x")], 5, BIG) == {"spool_full_events": ["w2"]}
    assert ids(db) == ["c1", "c2", "c3", "c4", "c5"]
    assert db.add("a", [("c6", CRITICAL, b"x")], 5, BIG) == {"spool_full_events": ["c1"]}
    assert ids(db) == ["c2", "c3", "c4", "c5", "c6"]
    assert db.share("a").events == 5


def test_byte_bound_uses_the_same_order_and_its_own_reason(db: SpoolDB) -> None:
    db.add("a", [("i1", INFO, b"x" * 100), ("c1", CRITICAL, b"x" * 100), ("w1", WARNING, b"x" * 100)], BIG, 1000)
    assert db.share("a").bytes == 300
    assert db.add("a", [("c2", CRITICAL, b"x" * 150)], BIG, 300) == {"spool_full_bytes": ["i1", "w1"]}
    assert ids(db) == ["c1", "c2"]
    assert db.share("a").bytes == 250
    # The cached share matches the table.
    assert db.share("a", refresh=True).bytes == 250


def test_dead_letters_are_kept_and_retry_revives_them(tmp_path: Path, db: SpoolDB) -> None:
    db.add("a", [("e1", INFO, b"x"), ("e2", INFO, b"x"), ("e3", INFO, b"x")], BIG, BIG, now=100.0)
    rows = db.rows()
    db.bury("a", rows[0].seq, "e1", 3, "rejected", "HTTP 400")
    db.bury("a", rows[1].seq, "e2", 9, "expired", "HTTP 503")
    assert db.head("a").event_id == "e3"  # type: ignore[union-attr]
    assert [(r.event_id, r.state, r.dead_reason) for r in db.rows(DEAD)] == [
        ("e1", DEAD, "rejected"),
        ("e2", DEAD, "expired"),
    ]
    db.disable("a", "hash", "HTTP 410")
    assert db.disabled("a", "hash") == "HTTP 410" and db.disabled("a", "other-url") is None
    # Another process (the CLI) retries one of them.
    cli = SpoolDB(tmp_path / "spool.db")
    assert cli.retry(["e2"]) == 1
    assert db.disabled("a", "hash") is None
    revived = next(r for r in db.rows(PENDING) if r.event_id == "e2")
    assert revived.attempts == 0 and revived.enqueued > 100.0 and revived.dead_reason is None
    assert db.head("a").event_id == "e2"  # type: ignore[union-attr]  # back in its original place in the order
    assert cli.retry() == 1
    assert db.rows(DEAD) == []
    assert db.share("a", refresh=True).pending == 3


def test_a_failed_commit_leaves_nothing_half_done(db: SpoolDB) -> None:
    db.add("a", [("e1", INFO, b"x")], BIG, BIG)
    with pytest.raises(sqlite3.ProgrammingError):
        db.add("a", [("e2", INFO, b"x"), ("e3", INFO, object())], BIG, BIG)  # type: ignore[list-item]
    assert ids(db) == ["e1"]
    assert db.share("a").pending == 1


class CommitFails(SpoolDB):
    """Every write transaction does its work and is then refused, as a full disk refuses the COMMIT in WAL mode."""

    refuse = False

    def _tx(self, sync: str, fn: Callable[[], T]) -> T:
        def then_refused() -> T:
            result = fn()
            if self.refuse:
                raise sqlite3.OperationalError("database or disk is full")
            return result

        return super()._tx(sync, then_refused)


def test_a_refused_write_leaves_the_cached_share_as_on_disk(tmp_path: Path) -> None:
    """The sender retries a delete the disk refused; the share the bounds are checked against counts it once."""
    db = CommitFails(tmp_path / "spool.db")
    db.add("a", [(f"e{i}", WARNING, b"xx") for i in range(3)], BIG, BIG)
    head = db.head("a")
    assert head is not None
    db.refuse = True
    for _ in range(3):
        with pytest.raises(sqlite3.OperationalError):
            db.delivered("a", head.seq, head.event_id)
        with pytest.raises(sqlite3.OperationalError):
            db.bury("a", head.seq, head.event_id, 1, "rejected", "HTTP 400")
    assert (db.share("a").pending, db.share("a").dead, db.share("a").bytes) == (3, 0, 6)
    with pytest.raises(sqlite3.OperationalError):
        db.add("a", [("e9", WARNING, b"xx")], BIG, BIG)
    assert (db.share("a").pending, db.share("a").dead, db.share("a").bytes) == (3, 0, 6)
    db.refuse = False
    db.delivered("a", head.seq, head.event_id)
    assert db.share("a") == db.share("a", refresh=True) == Share(pending=2, dead=0, bytes=4)


def test_a_refused_commit_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A COMMIT sqlite refuses without rolling back itself (here a deferred foreign key): the next one still works."""
    db = sqlite3.connect(tmp_path / "t.db", isolation_level=None)
    db.executescript(
        "PRAGMA foreign_keys=ON; CREATE TABLE p (id INTEGER PRIMARY KEY);"
        "CREATE TABLE c (p INTEGER REFERENCES p (id) DEFERRABLE INITIALLY DEFERRED);"
    )
    with pytest.raises(sqlite3.IntegrityError):
        transaction(db, lambda: db.execute("INSERT INTO c VALUES (1)"))
    assert not db.in_transaction
    transaction(db, lambda: db.execute("INSERT INTO p VALUES (1)"))
    assert db.execute("SELECT COUNT(*) FROM p").fetchone()[0] == 1
    assert db.execute("SELECT COUNT(*) FROM c").fetchone()[0] == 0
