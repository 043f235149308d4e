"""The sender's spool bookkeeping is batched: delivered rows are deleted together, a few transactions for a backlog
rather than one per event, and never at the cost of order, of an event, or of a duplicate after a clean stop (a real
loopback receiver, the real spool)."""

from __future__ import annotations

import collections
import functools
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec
import pytest

from nvdaemon.sinks.webhook.spool import FILE, SpoolDB

from .helpers import SECRET, Script, disk_full, event, hook, malformed, running, until
from .receiver import Receiver

T = TypeVar("T")
EVENTS = 100
URL = "http://127.0.0.1:9/hook"  # never dialled: the transport answers


def count_calls(monkeypatch: pytest.MonkeyPatch, *names: str) -> collections.Counter[str]:
    calls: collections.Counter[str] = collections.Counter()
    for name in names:
        original = getattr(SpoolDB, name, None)
        if original is None:
            continue  # not a method of this spool (``heads`` is the read-ahead's)

        def counted(self: SpoolDB, *args: Any, _name: str = name, _fn: Any = original, **kw: Any) -> Any:
            calls[_name] += 1
            return _fn(self, *args, **kw)

        monkeypatch.setattr(SpoolDB, name, counted)
    return calls


async def test_a_backlog_is_delivered_in_order_with_a_few_delete_transactions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = count_calls(monkeypatch, "_tx", "head", "heads")
    with Receiver(secret=SECRET) as rx:
        async with running(tmp_path, hook(rx.url)) as (sink, bus):
            sent = [event(i) for i in range(EVENTS)]
            for ev in sent:
                bus.publish(ev)
            await until(lambda: sink.attempts.get("success") == EVENTS and sink.backlog == 0)
            await until(lambda: SpoolDB(tmp_path / FILE).rows() == [])
    assert rx.ids() == [ev.id for ev in sent]  # in order, each once
    # One read per 32 rows (and one per idle wake-up); one transaction per 32 deletes plus the ingest's commits.
    # One per event (the old way) would be at least EVENTS of each.
    assert calls["heads"] + calls["head"] < EVENTS // 4
    assert calls["_tx"] < EVENTS // 4


async def test_a_clean_stop_forgets_what_was_delivered(tmp_path: Path) -> None:
    """Stopped mid read-ahead, with a request out, the rows delivered so far are deleted on the way out: the next
    run sends only the rest, from the unanswered event on."""
    first = Script(lambda seq, n: httpx.Response(200) if seq < 5 else None)  # event 5 is never answered
    async with running(tmp_path, hook(URL), transport=first.transport()) as (sink, bus):
        for i in range(10):
            bus.publish(event(i))
        await until(lambda: first.delivered == [0, 1, 2, 3, 4] and len(first.times(5)) == 1)
        assert sink.backlog == 5  # delivered rows not yet deleted are no longer the backlog
    assert [r.event_id for r in SpoolDB(tmp_path / FILE).rows()] == [event(i).id for i in range(5, 10)]
    second = Script(lambda seq, n: httpx.Response(200))
    async with running(tmp_path, hook(URL), transport=second.transport()) as (sink, _bus):
        await until(lambda: sink.attempts.get("success") == 5)
    assert second.delivered == [5, 6, 7, 8, 9]


class Tight(SpoolDB):
    """A spool whose disk has room for a transaction that changes one row, not more (while ``tight``)."""

    tight = False

    def _tx(self, sync: str, fn: Callable[[], T]) -> T:
        def guarded() -> T:
            before = self.db.total_changes
            result = fn()
            if self.tight and self.db.total_changes - before > 1:
                raise disk_full()  # inside the transaction: rolled back, as a WAL that cannot grow would be
            return result

        return super()._tx(sync, guarded)


def test_deletes_refused_together_for_space_are_done_one_by_one(tmp_path: Path) -> None:
    db = Tight(tmp_path / FILE)
    db.add("a", [(event(i).id, 1, msgspec.json.encode(event(i))) for i in range(5)], 100, 1 << 30)
    rows = db.heads("a", 5)
    db.tight = True
    rest = db.forget("a", [(r.seq, r.event_id) for r in rows[:3]], 5)
    assert [r.event_id for r in rest] == [event(3).id, event(4).id]
    share = db.cached_share("a")
    assert share is not None and share.pending == 2
    assert [r.event_id for r in db.rows()] == [event(3).id, event(4).id]


def test_a_damaged_spool_is_not_retried_one_delete_at_a_time(tmp_path: Path) -> None:
    db = Tight(tmp_path / FILE)
    db.add("a", [(event(i).id, 1, msgspec.json.encode(event(i))) for i in range(3)], 100, 1 << 30)
    rows = db.heads("a", 3)
    calls = 0

    def damaged(self: SpoolDB, sync: str, fn: Callable[[], T]) -> T:
        nonlocal calls
        calls += 1
        raise malformed()

    db._tx = functools.partial(damaged, db)  # type: ignore[method-assign]
    with pytest.raises(sqlite3.DatabaseError):
        db.forget("a", [(r.seq, r.event_id) for r in rows], 3)
    assert calls == 1  # the batch only: a damaged file is moved aside by the caller, not written to again
    assert len(db.rows()) == 3
