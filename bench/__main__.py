"""``make bench``: first figures for the spine. Not a test: it prints numbers, asserts nothing.

- CPU time per core-tier collection cycle (this host's /proc and /sys, all nine collectors, read+parse+interpret);
- ``/metrics`` latency p50/p99 over 500 scrapes of a running agent (subprocess, embedded default, this host);
- the agent's RSS after start and after the scrapes (from /proc/<pid>/status);
- ``/v1/events`` fan-out latency p50/p99 to 100 websocket clients at 100 and 1,000 events/s, drops counted
  (``bench/stream.py``);
- webhook: signed events per second to a loopback receiver, emission-to-receipt p50/p99 with no backlog, and the
  agent's RSS with 100,000 events spooled (``bench/webhook.py``);
- history: ingest cost per tick with 500 allowlisted series, a 90-day query for one series, bytes per point on disk
  after five simulated years of 8 GPUs (``bench/history.py``).

Results are printed as a table and written to bench/results.json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import trio

from bench.common import free_port, rss_kib
from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import HostRoots
from nvdaemon.tiers import CollectorRunner, collect_tier

OUT = Path(__file__).parent / "results.json"
CYCLES = 200
SCRAPES = 500


def cycle_cpu(host_root: Path | None) -> dict[str, float]:
    """Mean process CPU seconds per core-tier cycle, measured around CYCLES cycles after a warm-up."""
    roots = HostRoots.under(host_root) if host_root else HostRoots()

    async def main() -> dict[str, float]:
        limiter = trio.CapacityLimiter(4)
        runners = [CollectorRunner(c, limiter) for c in collectors_for_tier("core")]
        for _ in range(5):
            await collect_tier("core", runners, roots, 5.0)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        samples = 0
        for _ in range(CYCLES):
            snap = await collect_tier("core", runners, roots, 5.0)
            samples = len(snap.samples)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        return {"cpu_ms_per_cycle": cpu / CYCLES * 1000, "wall_ms_per_cycle": wall / CYCLES * 1000, "samples": samples}

    return trio.run(main)


def render_cost(host_root: Path | None) -> dict[str, float]:
    """Uncached /metrics render of one core-tier snapshot (what a scrape costs right after each tick)."""
    from nvdaemon.app import Agent
    from nvdaemon.config import parse_config
    from nvdaemon.server.metrics import MetricsCache

    roots = HostRoots.under(host_root) if host_root else HostRoots()
    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(parse_config(f"stateDir: {tmp}\n", "bench", env={}))

        async def snapshot() -> None:
            runners = [CollectorRunner(c, trio.CapacityLimiter(4)) for c in collectors_for_tier("core")]
            for _ in range(2):  # two ticks, so cpu utilisation samples exist
                agent.on_snapshot(await collect_tier("core", runners, roots, 5.0))

        trio.run(snapshot)
        cache = MetricsCache(agent)
        times = []
        for _ in range(200):
            agent.changes += 1  # invalidate the cache: measure a full render every time
            t0 = time.perf_counter()
            cache.render()
            times.append(time.perf_counter() - t0)
    times.sort()
    return {"render_p50_ms": statistics.median(times) * 1000, "render_p99_ms": times[197] * 1000}


def scrape_latency() -> dict[str, float]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "bench.yaml"
        cfg.write_text(f"stateDir: {tmp}/state\nsinks: {{metrics: {{listenAddr: '127.0.0.1:{port}'}}}}\n")
        proc = subprocess.Popen(
            [sys.executable, "-m", "nvdaemon", "run", "--config", str(cfg), "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            rss_start = rss_kib(proc.pid)
            times = []
            size = 0
            for _ in range(SCRAPES):
                t0 = time.perf_counter()
                with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                    size = len(r.read())
                times.append(time.perf_counter() - t0)
            rss_end = rss_kib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    times.sort()
    return {
        "scrape_p50_ms": statistics.median(times) * 1000,
        "scrape_p99_ms": times[int(len(times) * 0.99) - 1] * 1000,
        "exposition_bytes": size,
        "rss_after_start_mib": rss_start / 1024,
        "rss_after_scrapes_mib": rss_end / 1024,
    }


def main() -> int:
    host = os.environ.get("BENCH_HOST_ROOT")
    results: dict[str, Any] = {"host_root": host or "/"}
    print(f"core-tier cycle: {CYCLES} cycles on {host or 'this host'} ...", flush=True)
    results.update(cycle_cpu(Path(host) if host else None))
    results.update(render_cost(Path(host) if host else None))
    print(f"/metrics: {SCRAPES} scrapes of a running agent ...", flush=True)
    results.update(scrape_latency())
    from bench.stream import CLIENTS, RATE, fanout_latency

    for rate in (RATE // 10, RATE):
        print(f"/v1/events: fan-out to {CLIENTS} websocket clients at {rate} events/s ...", flush=True)
        results.update(fanout_latency(rate))
    from bench.webhook import SPOOLED, delivery, spooled_rss

    print("webhook: signed delivery to a loopback receiver; agent RSS with a full spool ...", flush=True)
    results.update(delivery())
    print(f"webhook: agent RSS with {SPOOLED} events spooled ...", flush=True)
    results.update(spooled_rss())
    from bench.history import run as history

    print("history: ingest per tick, 90-day query, five simulated years of 8 GPUs on disk ...", flush=True)
    results.update(history())
    width = max(len(k) for k in results)
    for key, value in results.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"{key:<{width}}  {shown}")
    OUT.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
