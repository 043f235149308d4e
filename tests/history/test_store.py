"""The sqlite file: round trip, merge of a late sample, retention pruning, pending windows, SQL-looking values, a
corrupt file at open, and the compactness figure (bytes per stored point, index included)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from nvdaemon.history.core import EPOCH, Acc, SeriesKey, TooManyPoints, WindowKey, to_minutes
from nvdaemon.history.store import HistoryStore, open_store
from tests.history.helpers import T0

GPU0: SeriesKey = ("gpu_temperature_celsius", "gpu0", ())


def win(key: SeriesKey, end: int, *values: float) -> tuple[WindowKey, Acc]:
    acc = Acc(1, values[0], values[0], values[0])
    for v in values[1:]:
        acc.add(v)
    return (key, end), acc


def test_round_trip_oldest_first_with_labels(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    labelled: SeriesKey = ("psi_stall_ratio_avg10", "memory", (("share", "some"),))
    assert store.write([win(GPU0, T0 + 600, 50.0), win(GPU0, T0 + 300, 40.0, 44.5), win(labelled, T0 + 300, 70)]) == 3
    got = store.query("gpu_temperature_celsius", None, None, None, 100)
    assert [(s.device, s.labels, s.points) for s in got.series] == [
        ("gpu0", {}, [(T0 + 300, 42.25, 40.0, 44.5), (T0 + 600, 50.0, 50.0, 50.0)])
    ]
    got = store.query("psi_stall_ratio_avg10", "memory", None, None, 100)
    assert got.series[0].labels == {"share": "some"}
    assert store.query("psi_stall_ratio_avg10", "other", None, None, 100).series == []
    assert store.query("nope", None, None, None, 100).series == []
    store.close()
    reopened = HistoryStore(tmp_path / "h.db")  # series ids come back from the file
    reopened.write([win(GPU0, T0 + 900, 1.0)])
    assert reopened.stats()[0] == 2
    assert len(reopened.query("gpu_temperature_celsius", None, None, None, 100).series[0].points) == 3


def test_late_sample_merges_into_the_written_point(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.write([win(GPU0, T0 + 300, 40.0, 60.0)])
    store.write([win(GPU0, T0 + 300, 80.0)])  # arrived after its window was written
    (point,) = store.query("gpu_temperature_celsius", None, None, None, 10).series[0].points
    assert point == (T0 + 300, 65.0, 40.0, 80.0)  # min and max exact, average the mean of the two


def test_retention_prunes_old_points_per_series(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    other: SeriesKey = ("gpu_power_watts", "gpu0", ())
    store.write([win(k, T0 + i * 3600, 1.0) for k in (GPU0, other) for i in range(1, 49)])
    store.write([], prune_before=T0 + 24 * 3600)
    for metric in ("gpu_temperature_celsius", "gpu_power_watts"):
        times = [p[0] for p in store.query(metric, None, None, None, 100).series[0].points]
        assert times == [T0 + i * 3600 for i in range(24, 49)]


def test_since_and_step_and_the_point_limit(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.write([win(GPU0, T0 + i * 300, float(i)) for i in range(1, 13)])  # one hour
    pts = store.query("gpu_temperature_celsius", None, T0 + 6 * 300, None, 100).series[0].points
    assert [p[0] for p in pts] == [T0 + i * 300 for i in range(6, 13)]
    hourly = store.query("gpu_temperature_celsius", None, None, 3600, 100).series[0].points
    assert [(p[2], p[3]) for p in hourly] == [(1.0, 8.0), (9.0, 12.0)]  # T0 is 20 minutes into an hour
    with pytest.raises(TooManyPoints) as info:
        store.query("gpu_temperature_celsius", None, None, None, 11)
    assert info.value.points == 12
    assert len(store.query("gpu_temperature_celsius", None, None, 3600, 11).series[0].points) == 2


def test_pending_windows_survive_a_reopen_once(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.write([], pending=[win(GPU0, T0 + 300, 10.0, 20.0)])
    store.close()
    store = HistoryStore(tmp_path / "h.db")
    ((key, end), acc), *rest = store.take_pending()
    assert (key, end, acc.as_tuple(), rest) == (GPU0, T0 + 300, (2, 30.0, 10.0, 20.0), [])
    assert store.take_pending() == []


def test_sql_looking_values_stay_data(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    evil: SeriesKey = ("x'; DROP TABLE points; --", "gpu0' OR '1'='1", (("k", '"); DELETE FROM series; --'),))
    store.write([win(evil, T0 + 300, 1.0), win(GPU0, T0 + 300, 2.0)])
    got = store.query(evil[0], evil[1], None, None, 10).series
    assert [(s.device, s.labels) for s in got] == [(evil[1], {"k": '"); DELETE FROM series; --'})]
    assert store.query("gpu_temperature_celsius", "gpu0' OR '1'='1", None, None, 10).series == []
    assert store.point_count() == 2 and store.stats()[0] == 2


def test_garbage_file_is_moved_aside_and_a_fresh_one_started(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"definitely not sqlite " * 300)
    with caplog.at_level(logging.ERROR):
        store, moved = open_store(path)
    assert moved
    assert [p.name.startswith("history.db.corrupt-") for p in tmp_path.iterdir() if "corrupt" in p.name] == [True]
    assert "unreadable" in caplog.text and "history.db" in caplog.text
    assert store.write([win(GPU0, T0 + 300, 1.0)]) == 1
    store.close()
    _, moved = open_store(path)
    assert not moved


def test_a_healthy_file_opens_untouched(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    HistoryStore(path).write([win(GPU0, T0 + 300, 1.0)])
    store, moved = open_store(path)
    assert not moved and store.point_count() == 1
    with pytest.raises(sqlite3.ProgrammingError):
        store.close()
        store.point_count()


def test_under_32_bytes_per_point_index_included(tmp_path: Path) -> None:
    """30 days of 5-minute points for 8 GPUs x the quartet, written window after window as the agent does."""
    import random

    rng = random.Random(1)
    store = HistoryStore(tmp_path / "h.db")
    keys = [
        (m, f"gpu{g}", ())
        for g in range(8)
        for m in ("gpu_utilization_pct", "gpu_mem_used_bytes", "gpu_temperature_celsius", "gpu_power_watts")
    ]
    scale = {
        "gpu_utilization_pct": 100,
        "gpu_mem_used_bytes": 80e9,
        "gpu_temperature_celsius": 85,
        "gpu_power_watts": 700,
    }
    windows = 30 * 288
    for day in range(0, windows, 288):
        batch = []
        for w in range(day, day + 288):
            for key in keys:
                top = scale[key[0]]
                batch.append(win(key, T0 + (w + 1) * 300, rng.random() * top, rng.random() * top, rng.random() * top))
        store.write(batch)
    points = store.point_count()
    assert points == windows * 32
    db = store.db
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    assert size / points < 32, size / points
    assert to_minutes(EPOCH + 60) == 1
