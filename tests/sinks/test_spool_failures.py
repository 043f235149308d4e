"""Spool writes the stateDir refuses, injected where the spool writes (``SpoolDB._tx``, see ``helpers.Faults``), on a
virtual clock: the events are kept and retried, ``committed_seq`` never passes one that is not on disk, overflow is
counted by reason with the ids logged, and emitted = delivered + counted drops, exactly."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from nvdaemon.sinks.webhook.spool import FILE, SpoolDB

from .helpers import Faults, Script, disk_full, event, hook, io_error, read_only, running, until
from .test_webhook_policy import URL, exposition


def ok(seq: int, n: int) -> httpx.Response:
    return httpx.Response(200)


@pytest.mark.parametrize("error", [disk_full, io_error, read_only])
async def test_a_refused_write_keeps_the_events_and_holds_committed_seq_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, error: Callable[[], BaseException]
) -> None:
    faults = Faults()
    script = Script(ok)
    async with running(tmp_path, hook(URL), transport=script.transport(), opener=faults.opener) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: script.delivered == [1])
        assert sink.committed_seq == 1
        faults.error = error()
        for i in range(2, 22):
            bus.publish(event(i))
        await until(lambda: sink.health.error is not None)
        await trio.sleep(60)  # many refused retries
        assert sink.committed_seq == 1  # engine state may not be saved past event 2, which is only in memory
        state = sink.state()
        assert state["state"] == "degraded" and state["stateWritable"] is False and state["unspooled"] == 20
        assert state["storageError"] and sink.degraded() is not None
        assert script.delivered == [1]
        assert 'nodevitals_webhook_unspooled{sink="webhook:test"} 20.0' in exposition(sink)
        faults.error = None  # space freed
        await until(lambda: script.delivered == list(range(1, 22)), timeout=100)
        await until(lambda: sink.backlog == 0)
        assert sink.committed_seq == 21
        assert sink.dropped == {} and sink.state()["state"] == "active" and sink.state()["unspooled"] == 0
        assert sink.degraded() is None and sink.state_writable() is True


async def test_a_full_buffer_drops_lowest_severity_oldest_first_counted_and_logged(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    faults = Faults()
    script = Script(ok)
    severities = ["critical", "info", "warning", "info", "critical", "warning", "info", "critical", "warning", "info"]
    emitted = [event(1)] + [event(i, severity=sev) for i, sev in enumerate(severities, start=2)]
    caplog.set_level(logging.WARNING, "nvdaemon.sinks.webhook")
    async with running(tmp_path, hook(URL), transport=script.transport(), opener=faults.opener, buffer_events=5) as (
        sink,
        bus,
    ):
        bus.publish(emitted[0])
        await until(lambda: script.delivered == [1])
        faults.error = disk_full()
        for ev in emitted[1:]:
            bus.publish(ev)
        await until(lambda: sink.dropped.get("spool_unwritable") == 5)
        # Kept: the five highest, oldest first within a severity; info 3, 5, 8, 11 and warning 4 went.
        assert [i.seq for i in sink.writer.buffer.all()] == [2, 6, 7, 9, 10]
        assert sink.committed_seq == 1  # event 2 is still only in memory
        faults.error = None
        await until(lambda: len(script.delivered) == 6, timeout=100)
        assert sink.committed_seq == 11  # everything up to 11 is delivered or dropped and counted
        text = exposition(sink)
    assert script.delivered == [1, 2, 6, 7, 9, 10]
    dropped_ids = {i for r in caplog.records if (d := getattr(r, "dropped", None)) for i in d["ids"]}
    assert dropped_ids == {event(i).id for i in (3, 4, 5, 8, 11)}
    assert {ev.id for ev in emitted} == {event(s).id for s in script.delivered} | dropped_ids  # exactly
    assert 'nodevitals_webhook_dropped_total{reason="spool_unwritable",sink="webhook:test"} 5.0' in text
    assert any(event(3).id in r.getMessage() and "spool_unwritable" in r.getMessage() for r in caplog.records)


async def test_a_delivered_event_whose_delete_is_refused_is_not_sent_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    faults = Faults()

    def answer(seq: int, n: int) -> httpx.Response:
        if seq == 1:
            faults.error = disk_full()  # the disk fills while the receiver answers
        return httpx.Response(200)

    script = Script(answer)
    async with running(tmp_path, hook(URL), transport=script.transport(), opener=faults.opener) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: sink.health.error is not None)
        await trio.sleep(60)
        assert len(script.times(1)) == 1 and sink.state()["state"] == "degraded"
        assert sink.attempts == {"success": 1}
        faults.error = None
        await until(lambda: sink.backlog == 0 and sink.health.error is None, timeout=100)
        bus.publish(event(2))
        await until(lambda: script.delivered == [1, 2])
    assert len(script.times(1)) == 1
    assert SpoolDB(tmp_path / FILE).rows() == []


async def test_a_state_dir_that_cannot_hold_the_spool_at_all_does_not_crash_the_task(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    faults = Faults()
    faults.open_error = PermissionError(13, "Permission denied")
    script = Script(ok)
    async with running(tmp_path, hook(URL), transport=script.transport(), opener=faults.opener) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: sink.health.error is not None)
        await trio.sleep(60)
        assert sink.state()["storageError"] == "Permission denied" and sink.committed_seq == 0
        faults.open_error = None
        await until(lambda: script.delivered == [1], timeout=100)
        assert sink.committed_seq == 1 and sink.health.error is None


async def test_closing_a_stopped_endpoint_counts_every_event_it_held_in_memory_or_in_its_channel(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Replaced on reload, removed, or the agent stopping while the stateDir refuses writes: what the writer held in
    memory and what was still in the bus channel (its final drain stops at the first refused write) is dropped
    and counted, so emitted = delivered + counted drops."""
    faults = Faults()
    script = Script(ok)
    caplog.set_level(logging.WARNING, "nvdaemon.sinks.webhook.metrics")
    async with running(tmp_path, hook(URL), transport=script.transport(), opener=faults.opener) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: script.delivered == [1])
        faults.error = disk_full()
        for i in range(2, 6):
            bus.publish(event(i))
        await until(lambda: len(sink.writer.buffer) == 4)
    for i in range(6, 9):  # published after the task stopped, before the sink is closed
        bus.publish(event(i))
    sink.close()
    assert sink.dropped == {"unspooled_at_stop": 7}
    dropped_ids = {i for r in caplog.records if (d := getattr(r, "dropped", None)) for i in d["ids"]}
    assert dropped_ids == {event(i).id for i in range(2, 9)}
    assert "webhook:test" not in bus.subscriptions and len(sink.writer.buffer) == 0
