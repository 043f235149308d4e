"""The history task: the loop flushes each window after it ends (injected wall clock on a mock trio clock), a
graceful restart mid-window keeps the window, a crash loses at most the window in progress, a corrupt file is moved
aside, metrics and state, and the agent's wiring (on_snapshot -> ingest, shutdown flush)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
import trio
import trio.testing

from nvdaemon.history.core import Query
from nvdaemon.history.service import HistorySink
from nvdaemon.history.store import HistoryStore
from nvdaemon.supervise import Supervisor
from tests.history.helpers import T0, Wall, make_agent, make_sink, serving, snap, temps
from tests.polling import until

ALL = Query(None, None, None, None)


async def points(sink: HistorySink, metric: str = "gpu_temperature_celsius") -> list[tuple[int, float, float, float]]:
    got = await sink.query(metric, ALL)
    return [p for s in got.series for p in s.points]


async def test_loop_writes_each_window_after_it_ends(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    agent = make_agent(tmp_path)
    base = T0 - trio.current_time()
    sink = HistorySink(agent.sink_context(), wall=lambda: base + trio.current_time())
    async with serving(sink):
        sink.ingest(temps("gpu0", (40.0, T0 + 1), (60.0, T0 + 100)))
        sink.ingest(temps("gpu0", (10.0, T0 + 301)))
        await trio.sleep(299)
        assert await points(sink) == []  # the window has not ended
        await trio.sleep(10)  # past its end and the settle time: the loop wrote it, nothing else
        assert await points(sink) == [(T0 + 300, 50.0, 40.0, 60.0)]
        assert sink.points_written == 1 and sink.series == 1
        # Windows without samples write nothing: a gap, not an invented point.
        sink.ingest(temps("gpu0", (30.0, T0 + 1250)))
        # A worker thread lets the mock clock jump, so wait for the loop's own flush rather than a fixed time.
        await until(lambda: (sink.last_flush_at or 0) >= T0 + 1500, "the flush of T0+1500", timeout=3600, step=1)
        assert await points(sink) == [
            (T0 + 300, 50.0, 40.0, 60.0),
            (T0 + 600, 10.0, 10.0, 10.0),
            (T0 + 1500, 30.0, 30.0, 30.0),
        ]


async def test_graceful_restart_mid_window_keeps_the_window(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    wall = Wall(T0 + 120)
    first = make_sink(agent, wall)
    async with serving(first):
        first.ingest(temps("gpu0", (40.0, T0 + 10), (60.0, T0 + 110)))
    # Stopped as SIGTERM, a reload or a task restart stops it: the final flush saved the window in progress.
    assert first.store is None and first.windows.open == {}
    wall.now = T0 + 310
    second = make_sink(agent, wall)
    async with serving(second):
        second.ingest(temps("gpu0", (80.0, T0 + 200)))
        assert await second.flush() == 1
        assert await points(second) == [(T0 + 300, 60.0, 40.0, 80.0)]


async def test_a_crash_loses_at_most_the_window_in_progress(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    wall = Wall(T0 + 299)
    sink = make_sink(agent, wall)
    async with serving(sink):
        sink.ingest(temps("gpu0", (40.0, T0 + 10), (50.0, T0 + 290)))
        wall.now = T0 + 305
        sink.ingest(temps("gpu0", (70.0, T0 + 301)))
        await sink.flush()  # what the loop does just after each window ends
        # The process dies here: what another process finds in the file is everything but the window in progress.
        other = HistoryStore(sink.path)
        found = other.query("gpu_temperature_celsius", None, None, None, 10)
        assert [s.points for s in found.series] == [[(T0 + 300, 45.0, 40.0, 50.0)]]
        assert other.take_pending() == []
        other.close()


async def test_corrupt_file_is_moved_aside_not_a_crash_loop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent = make_agent(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (state / "history.db").write_bytes(b"\x00garbage" * 1000)
    sink = make_sink(agent, Wall(T0 + 400))
    with caplog.at_level(logging.ERROR):
        async with serving(sink):
            sink.ingest(temps("gpu0", (40.0, T0 + 10)))
            assert await sink.flush() == 1
            assert sink.quarantined == 1 and sink.state()["quarantined"] == 1
    assert any(p.name.startswith("history.db.corrupt-") for p in state.iterdir())
    assert "moved to" in caplog.text


async def test_damage_found_later_is_moved_aside_and_the_query_answers(tmp_path: Path) -> None:
    agent = make_agent(tmp_path)
    wall = Wall(T0 + 100 * 86400)
    sink = make_sink(agent, wall)
    async with serving(sink):
        for day in range(60):
            sink.ingest(temps("gpu0", *((float(i % 50), T0 + day * 86400 + i * 300) for i in range(288))))
        await sink.flush()
    db = sink.path
    data = bytearray(db.read_bytes())
    assert len(data) > 100_000
    for offset in range(8192, len(data), 4096):  # wreck every b-tree page after the first two
        data[offset : offset + 64] = b"\xff" * 64
    db.write_bytes(bytes(data))
    sink = make_sink(agent, wall)
    async with serving(sink):
        assert await points(sink) == []
        assert sink.quarantined == 1
        sink.ingest(temps("gpu0", (1.0, wall.now - 400)))
        assert await sink.flush() == 1


async def test_retention_is_applied_on_each_flush(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, "{enabled: true, retentionDays: 1, intervalMinutes: 10}")
    wall = Wall(T0 + 700)
    sink = make_sink(agent, wall)
    async with serving(sink):
        sink.ingest(temps("gpu0", (40.0, T0 + 1)))
        await sink.flush()
        assert [p[0] for p in await points(sink)] == [T0 + 600]  # 10-minute windows
        wall.now = T0 + 600 + 86400 + 1
        sink.ingest(temps("gpu0", (41.0, T0 + 86400)))
        await sink.flush()
        assert [p[0] for p in await points(sink)] == [T0 + 86400 + 600]


async def test_agent_wiring_metrics_state_and_shutdown_flush(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, "{enabled: true, metrics: [gpu_power_watts]}", extra="intervalSeconds: 10\n")
    async with trio.open_nursery() as nursery:
        agent.supervisor = sup = Supervisor(nursery)
        await agent.sync_sinks()
        sink = agent.sinks["history"]
        assert isinstance(sink, HistorySink)
        assert "history" not in agent.bus.drop_totals  # no bus subscription
        agent.on_snapshot(snap(("gpu_power_watts", "gpu0", 300.0, T0 + 5), ("gpu_temperature_celsius", "gpu0", 1, T0)))
        assert [k[0][0] for k in sink.windows.open] == ["gpu_power_watts"]  # the allowlist is the configured one
        changes = agent.changes
        await sup.stop("history")  # what SIGTERM does after the tier loops stopped
        assert sink.windows.open == {}
        nursery.cancel_scope.cancel()
    # The snapshot's window had ended by the wall clock: the shutdown flush wrote it as a point.
    store = HistoryStore(sink.path)
    found = store.query("gpu_power_watts", None, None, None, 10).series
    assert [s.points for s in found] == [[(T0 + 300, 300.0, 300.0, 300.0)]]
    store.close()
    assert agent.changes > changes and sink.series == 1 and sink.db_bytes > 0
    from nvdaemon.exposition import render

    text = render(sink.metrics())
    assert "nodevitals_history_points_written_total 1.0" in text
    assert "nodevitals_history_series 1.0" in text
    assert "nodevitals_history_db_bytes" in text
    assert sink.state()["open"] is False and sink.state()["metrics"] == ["gpu_power_watts"]


async def test_history_disabled_builds_nothing(tmp_path: Path) -> None:
    agent = make_agent(tmp_path, "{enabled: false}")
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        assert "history" not in agent.sinks
        nursery.cancel_scope.cancel()
    assert not (tmp_path / "state" / "history.db").exists()


async def test_a_full_state_dir_keeps_the_windows_for_the_next_flush_not_a_task_crash(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(tmp_path)
    base = T0 - trio.current_time()
    sink = HistorySink(agent.sink_context(), wall=lambda: base + trio.current_time())
    write = HistoryStore.write

    def full(*args: object, **kwargs: object) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    async with serving(sink):
        monkeypatch.setattr(HistoryStore, "write", full)
        sink.ingest(temps("gpu0", (40.0, T0 + 1), (60.0, T0 + 301)))  # two windows
        # A worker thread lets the mock clock jump: wait for the loop's flushes rather than a fixed time.
        # Two refused flushes: the task goes on, the windows stay.
        await until(lambda: sink.flushes_refused >= 2, "two refused flushes", timeout=3600, step=1)
        assert sink.last_error is not None and sink.store is not None and len(sink.windows.open) == 2
        monkeypatch.setattr(HistoryStore, "write", write)
        await until(lambda: not sink.flushes_refused, "a flush accepted again", timeout=3600, step=1)
        assert await points(sink) == [(T0 + 300, 40.0, 40.0, 40.0), (T0 + 600, 60.0, 60.0, 60.0)]
