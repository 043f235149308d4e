"""History figures: ingest cost per tick with 500 allowlisted series, the time to answer a 90-day query for one
series, and bytes per stored point on disk after five simulated years of 8 GPUs (points generated directly, in the
order the agent writes them: one window of every series after the other, one transaction per simulated day).

``python -m bench.history [YEARS]`` runs it alone.
"""

from __future__ import annotations

import functools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from nvdaemon.history.core import Acc, Query, Windows, allowlist, encode_point, to_minutes
from nvdaemon.history.store import _UPSERT, HistoryStore
from nvdaemon.model import Sample
from nvdaemon.sqlitetx import transaction

SERIES = 500
TICKS = 2000
GPUS = 8
INTERVAL = 300
YEARS = 5.0
GPU_METRICS = ("gpu_utilization_pct", "gpu_mem_used_bytes", "gpu_temperature_celsius", "gpu_power_watts")


def ingest_cost() -> dict[str, float]:
    """Mean wall time of ``Windows.ingest`` (what ``Agent.on_snapshot`` pays) for a snapshot of 500 allowlisted
    samples plus 200 that are not kept."""
    windows = Windows(INTERVAL, allowlist([]))
    kept = [
        Sample(metric, f"gpu{i}", 1.0, labels=(("uuid", f"GPU-{i:04d}"),))
        for i in range(SERIES // 4)
        for metric in GPU_METRICS
    ]
    other = [Sample("cpu_util_pct", f"cpu{i}", 1.0) for i in range(200)]
    times = []
    t = 1_700_000_000.0
    for tick in range(TICKS):
        samples = [Sample(s.metric, s.device, float(tick % 97), labels=s.labels, timestamp=t) for s in kept] + other
        t0 = time.perf_counter()
        windows.ingest(samples, t)
        times.append(time.perf_counter() - t0)
        t += 15
        if tick % 20 == 19:
            windows.take_complete(t)  # what the flush does; keeps memory as in the agent
    times.sort()
    return {
        "history_ingest_us_per_tick_500_series": statistics.mean(times) * 1e6,
        "history_ingest_p99_us": times[int(len(times) * 0.99)] * 1e6,
    }


def generate(store: HistoryStore, years: float, seed: int = 7) -> int:
    """Five years (by default) of 5-minute points for 8 GPUs x the GPU quartet, time-major as the agent writes."""
    rng = random.Random(seed)
    keys = [(m, f"gpu{g}", (("uuid", f"GPU-{g:04d}"),)) for g in range(GPUS) for m in GPU_METRICS]
    ids = [store._series(k) for k in keys]
    # metric -> (low, high, walk step, spread of min/max within a window)
    shape = {
        "gpu_utilization_pct": (0.0, 100.0, 15.0, 20.0),
        "gpu_mem_used_bytes": (0.0, 80e9, 4e9, 2e9),
        "gpu_temperature_celsius": (28.0, 85.0, 2.0, 3.0),
        "gpu_power_watts": (60.0, 700.0, 40.0, 80.0),
    }
    state = [shape[k[0]][0] + (shape[k[0]][1] - shape[k[0]][0]) / 3 for k in keys]
    shapes = [shape[k[0]] for k in keys]
    rand = rng.random
    windows = int(years * 365.25 * 86400 / INTERVAL)
    start = (int(time.time()) // INTERVAL - windows) * INTERVAL  # the years up to now
    per_day = 86400 // INTERVAL
    written = 0
    for day0 in range(0, windows, per_day):
        rows = []
        for w in range(day0, min(windows, day0 + per_day)):
            t = to_minutes(start + (w + 1) * INTERVAL)
            for i, (sid, q) in enumerate(ids):
                low, high, step, spread = shapes[i]
                avg = state[i] = min(high, max(low, state[i] + (rand() - 0.5) * 2 * step))
                rows.append((sid, t, *encode_point(Acc(1, avg, avg - rand() * spread, avg + rand() * spread), q)))
        transaction(store.db, functools.partial(store.db.executemany, _UPSERT, rows))
        written += len(rows)
    return written


def disk(store: HistoryStore, points: int) -> dict[str, float]:
    db = store.db
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    as_written = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    t0 = time.perf_counter()
    db.execute("VACUUM")
    vacuum_s = time.perf_counter() - t0
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    packed = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    return {
        "history_points_5y_8gpu": points,
        "history_bytes_per_point_as_written": as_written / points,
        "history_bytes_per_point_after_vacuum": packed / points,
        "history_db_mib_as_written": as_written / 2**20,
        "history_vacuum_s": vacuum_s,
    }


def query_time(path: Path) -> dict[str, float]:
    """A 90-day query for one series through the HTTP route (quart test client): parse, read, encode."""
    from nvdaemon.app import Agent
    from nvdaemon.configload import parse_config
    from nvdaemon.history.service import HistorySink
    from nvdaemon.server.app import build_app

    agent = Agent(parse_config(f"stateDir: {path.parent}\nhistory: {{enabled: true}}\n", "bench", env={}))
    times: list[float] = []
    store_times: list[float] = []
    sizes: list[int] = []

    async def main() -> None:
        sink = HistorySink(agent.sink_context())
        sink.store = await trio.to_thread.run_sync(HistoryStore, path)
        agent.sinks["history"] = agent.history = sink
        client = build_app(agent, agent.loaded.config.server).test_client()
        since = int(time.time()) - 90 * 86400  # the data ends now
        for _ in range(20):
            t0 = time.perf_counter()
            result = await sink.query("gpu_temperature_celsius", Query(since, None, "gpu3", None))
            store_times.append(time.perf_counter() - t0)
            sizes.append(sum(len(s.points) for s in result.series))
        for _ in range(20):
            t0 = time.perf_counter()
            resp = await client.get("/v1/history/gpu_temperature_celsius?device=gpu3&range=90d")
            await resp.get_data()
            times.append(time.perf_counter() - t0)
            assert resp.status_code == 200, resp.status_code
        sink.store.close()

    trio.run(main)
    return {
        "history_query_90d_points": statistics.median(sizes),
        "history_query_90d_store_ms": statistics.median(store_times) * 1000,
        "history_query_90d_http_ms": statistics.median(times) * 1000,
    }


def run(years: float = YEARS) -> dict[str, Any]:
    results: dict[str, Any] = dict(ingest_cost())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.db"
        store = HistoryStore(path)
        t0 = time.perf_counter()
        points = generate(store, years)
        results["history_generate_s"] = time.perf_counter() - t0
        store.close()
        results.update(query_time(path))
        store = HistoryStore(path)
        results.update(disk(store, points))
        store.close()
    return results


if __name__ == "__main__":
    for k, v in run(float(sys.argv[1]) if len(sys.argv) > 1 else YEARS).items():
        print(f"{k:<50} {v:.3f}" if isinstance(v, float) else f"{k:<50} {v}")
