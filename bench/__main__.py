"""``make bench``: every benchmark, one table (figure | ours | reference | ratio | target | met), also written to
bench/results.json with the raw figures. Not a test: nothing here runs in ``make test``.

Each reference is measured in the same run, on the same machine:

- ``bench/floor.py``: CPU per core-tier cycle against reading the same files with no parsing (target <= 3x);
- ``bench/scrape.py``: /metrics p99 and CPU per scrape, 500 interleaved scrapes of ours (core tier + the
  node_exporter surface) and of Debian's node_exporter, on ``fixtures/hosts/gpunode`` and on this machine's own
  root, over a kept-alive connection and over a new connection per scrape, both asked for gzip as Prometheus asks
  (target ratio <= 0.25), and the gzip bytes on the wire per scrape;
- ``bench/held_files.py``: a procfs or sysfs file read through the descriptor the agent holds open, against opened
  afresh, on this machine's own core-tick files;
- ``bench/tick.py``: in-process CPU of a core tick with the node_* surface and of the gzip render after it, on
  gpunode, with the garbage collector's share and the objects a tick leaves to it;
- ``bench/steady.py``: CPU seconds per hour at a real 15 s interval and scrape rate (not scaled), side by side: the
  core tier with the node_* surface (target ratio <= 0.5) and every tier and sink (target ratio <= 1, RSS <= 80 MiB),
  against node_exporter, on gpunode; and the core tier with node_exporter again on this machine's own /proc and /sys;
- ``bench/growth.py``: cycle and render CPU at 1/8/64 GPUs, 4/24/60 disks, 10/100/1,000 textfile series: the cost
  per unit (least squares), the fixed cost, and how linear it is;
- ``bench/rss.py``: peak RSS of each pod shape the chart renders, and of the core pod with a full spool (<= 64 MiB;
  80 MiB for a shape with NVSentinel);
- ``bench/latency.py``: a fixture change -> ENTER at a webhook receiver, a websocket client and the NVSentinel
  connector, from the start of the tick that saw it (target p99 <= 50 ms);
- ``bench/stream.py``, ``bench/webhook.py``, ``bench/history.py``: the delivery and storage figures;
- ``bench/probes.py``: /healthz and /readyz while 500 keep-alive clients hammer /metrics (target max <= 1 s);
- ``bench/hostile.py``: peak RSS under hostile peers (a 100 MB webhook answer, a gzip bomb, a smartctl printing
  200 MB, 4 MB lines in host files; target <= 96 MiB) and SIGTERM to exit under them (target: the grace + 0.5 s).

``python -m bench NAME ...`` (``make bench ARGS="NAME ..."``) runs only the named benchmarks (``hostile``,
``probes``, ...), and writes their results to bench/results.NAME[-NAME...].json instead.

Without node_exporter installed the reference columns say "not installed". A benchmark that cannot run (the agent
failing at start, say) prints why, shows FAILED in its rows, and makes the command exit 1; the others still run.
``BENCH_STEADY_SECONDS`` sets the steady window (300 s, whole 15 s intervals); ``BENCH_HOST_ROOT`` moves the
cycle/floor figures to a host root; ``BENCH_NODE_EXPORTER_COLLECTORS`` restricts the node_exporter collectors on
both sides.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from bench.common import ROOT, BenchError
from bench.table import Row, Target, failed, missed, render

OUT = Path(__file__).parent / "results.json"
Section = Callable[[], tuple[list[Row], dict[str, Any]]]


def render_cost() -> tuple[list[Row], dict[str, Any]]:
    """Uncached /metrics render of one core-tier snapshot of this host (what the first scrape after a tick pays)."""
    from nvdaemon.app import Agent
    from nvdaemon.collectors import collectors_for_tier
    from nvdaemon.collectors.base import HostRoots
    from nvdaemon.configload import parse_config
    from nvdaemon.server.metrics import MetricsCache
    from nvdaemon.tiers import CollectorRunner, collect_tier

    with tempfile.TemporaryDirectory() as tmp:
        agent = Agent(parse_config(f"stateDir: {tmp}\n", "bench", env={}))

        async def snapshot() -> None:
            runners = [CollectorRunner(c, trio.CapacityLimiter(4)) for c in collectors_for_tier("core")]
            for _ in range(2):  # two ticks, so cpu utilisation samples exist
                agent.on_snapshot(await collect_tier("core", runners, HostRoots(), 5.0))

        trio.run(snapshot)
        times = []
        for _ in range(200):
            cache = MetricsCache(agent)  # a cache of its own each time: every part rendered
            t0 = time.perf_counter()
            cache.render()
            times.append(time.perf_counter() - t0)
    p50 = statistics.median(times) * 1000
    return [Row("/metrics render, uncached (core tier, this host)", p50, "ms")], {"render_p50_ms": p50}


def stream() -> tuple[list[Row], dict[str, Any]]:
    from bench.stream import CLIENTS, RATE, SECONDS, fanout_latency

    raw: dict[str, Any] = {}
    for rate in (RATE // 10, RATE):
        raw.update(fanout_latency(rate))
    p = f"fanout_{CLIENTS}c_"
    low, high = f"{p}{RATE // 10}eps_", f"{p}{RATE}eps_"
    delivered = (CLIENTS * RATE * SECONDS - raw[high + "messages_missing"]) / SECONDS
    raw[high + "delivered_msgs_per_s"] = delivered
    asked = Target("value", ">=", float(CLIENTS * RATE), "bench/stream.py")
    closed = CLIENTS - raw[low + "clients_complete"] + raw[low + "slow_disconnects"]
    rows = [
        Row(f"/v1/events {CLIENTS} clients @{RATE // 10}/s p50", raw[low + "p50_ms"], "ms"),
        Row(
            f"/v1/events {CLIENTS} clients @{RATE // 10}/s p99",
            raw[low + "p99_ms"],
            "ms",
            target=Target("value", "<=", 20),
        ),
        Row(f"/v1/events {CLIENTS} clients @{RATE // 10}/s closed", float(closed), target=Target("value", "<=", 0)),
        Row(f"/v1/events @{RATE // 10}/s CPU per message, agent", raw[low + "server_cpu_us_per_message"], "us"),
        Row(f"/v1/events @{RATE // 10}/s CPU per message, clients", raw[low + "client_cpu_us_per_message"], "us"),
        Row(f"/v1/events {CLIENTS} clients @{RATE}/s delivered", delivered, "msg/s", target=asked),
        Row(f"/v1/events {CLIENTS} clients @{RATE}/s slow closes", float(raw[high + "slow_disconnects"])),
    ]
    return rows, raw


def webhook() -> tuple[list[Row], dict[str, Any]]:
    from bench.webhook import SPOOLED, delivery, spooled_rss

    raw: dict[str, Any] = {**delivery(), **spooled_rss()}
    rows = [
        Row(
            "webhook delivered, signed, loopback",
            raw["webhook_events_per_s"],
            "ev/s",
            target=Target("value", ">=", 2000),
        ),
        Row("webhook agent CPU per delivered event", raw["webhook_agent_cpu_us_per_event"], "us"),
        Row("webhook emission->receipt p50", raw["webhook_latency_p50_ms"], "ms"),
        Row("webhook emission->receipt p99", raw["webhook_latency_p99_ms"], "ms"),
        Row(f"webhook agent RSS, {SPOOLED:,} spooled", raw["webhook_rss_spooled_mib"], "MiB"),
    ]
    return rows, raw


def history() -> tuple[list[Row], dict[str, Any]]:
    from bench.history import SERIES, run

    raw = run()
    rows = [
        Row(f"history ingest per tick, {SERIES} series", raw["history_ingest_us_per_tick_500_series"], "us"),
        Row("history 90-day query, one series (HTTP)", raw["history_query_90d_http_ms"], "ms"),
        Row("history bytes/point on disk (5 y x 8 GPUs)", raw["history_bytes_per_point_as_written"], "B"),
    ]
    return rows, raw


def sections() -> list[tuple[str, str, Section]]:
    from bench import floor, growth, held_files, hostile, kmsg, latency, probes, rss, scrape, steady, tick

    return [
        ("floor", "core-tier cycle CPU against reading the same files ...", floor.run),
        ("held", "a procfs/sysfs file read through a held descriptor against opened afresh ...", held_files.run),
        ("render", "/metrics render cost, uncached ...", render_cost),
        ("tick", f"a core+node_* tick and its gzip render in-process, {tick.TICKS} ticks on gpunode ...", tick.run),
        ("scrape", f"/metrics: {scrape.SCRAPES} interleaved scrapes of ours and of node_exporter ...", scrape.run),
        ("steady", f"steady cost over {steady.seconds():g} s at 15 s, two shapes and node_exporter ...", steady.run),
        ("rss", f"peak RSS of each pod shape the chart renders, {rss.TICKS} ticks each ...", rss.run),
        ("growth", "cycle and render CPU against GPUs, disks, textfile series ...", growth.run),
        ("latency", f"event latency over {latency.CHANGES} fixture changes ...", latency.run),
        ("stream", "/v1/events fan-out to 100 websocket clients ...", stream),
        ("webhook", "webhook delivery; agent RSS with a full spool ...", webhook),
        ("history", "history: ingest, 90-day query, five simulated years on disk ...", history),
        ("probes", f"/healthz, /readyz under {probes.CLIENTS} keep-alive /metrics clients ...", probes.run),
        ("hostile", "peak RSS and SIGTERM to exit under hostile peers ...", hostile.run),
        ("kmsg", "kernel-log source: CPU per 1,000 records, a 100,000-line storm ...", kmsg.run),
    ]


def main(argv: list[str]) -> int:
    chosen = sections()
    out = OUT
    if argv:  # a selection: only those, written beside the full run's results, never over them
        unknown = sorted(set(argv) - {name for name, _, _ in chosen})
        if unknown:
            print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(n for n, _, _ in chosen)}")
            return 2
        chosen = [s for s in chosen if s[0] in argv]
        out = OUT.with_name(f"results.{'-'.join(name for name, _, _ in chosen)}.json")
    rows: list[Row] = []
    raw: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    errors: dict[str, str] = {}
    for name, what, section in chosen:
        print(f"[{name}] {what}", flush=True)
        began = time.monotonic()
        try:
            got, figures = section()
        except Exception as exc:
            detail = str(exc) if isinstance(exc, BenchError) else traceback.format_exc()
            detail = detail.replace(str(ROOT), ".")  # results.json gets shared: no path of this machine in it
            print(f"[{name}] FAILED: {detail}", file=sys.stderr, flush=True)
            errors[name] = detail
            rows.append(failed(name, detail))
            continue
        rows += got
        raw.update(figures)
        raw[f"{name}_seconds"] = time.monotonic() - began
    print()
    print(render(rows))
    for line in missed(rows):
        print(f"missed: {line}")
    out.write_text(json.dumps({"rows": [r.as_json() for r in rows], "raw": raw, "errors": errors}, indent=2) + "\n")
    print(f"written to {out.relative_to(ROOT)}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
