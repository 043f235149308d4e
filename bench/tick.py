"""In-process CPU of one core tick with the node_* surface, and of the gzip render a scrape then pays.

The steady benchmark measures a running agent from outside, to a resolution of about 1 ms a cycle (the kernel's
CPU ticks over 20 cycles); this one takes the agent's two halves apart, in one process on a copy of gpunode, so a
change to a collector or to the render shows in tenths of a millisecond:

- ``tick``: ``app.tick`` of the core tier (the nodevitals_hw_* collectors and every node_exporter collector the
  scrape benchmark enables: ``collect_tier`` and ``Agent.on_snapshot``, automatic garbage collection paused), as
  ``serve_tier`` runs it, the sysfs batch in the tier's kept worker thread; process CPU (every thread) over the tick;
- ``render``: ``MetricsCache.answer`` asked for gzip right after the tick (the page changed: rendered from the
  parts kept, then compressed), process CPU;
- the garbage collector's share of both (``gc.callbacks``, the heap left by start-up frozen first, as ``nvdaemon
  run`` does) and how many objects the ticks left to it: run again with it off, what one ``gc.collect`` then finds
  is what reference counting could not free (a reference cycle per tick makes the collector walk the tick's whole
  heap again and again).

Medians over ``TICKS`` after ``WARMUP`` (the first ticks read what never changes). The machine is shared: compare
two runs of this module, not figures of different days. ``python -m bench.tick`` runs it alone.
"""

from __future__ import annotations

import gc
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import gpunode_with_disks
from bench.scrape import agent_config
from bench.scrape import collectors as node_exporter_names
from bench.table import Row
from nvdaemon.app import Agent, tier_collectors
from nvdaemon.app import tick as tier_tick
from nvdaemon.collectors.heldfiles import SETTLED_SECONDS
from nvdaemon.configload import parse_config
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.tiers import CollectorRunner
from nvdaemon.worker_thread import ReusableThread

TICKS = 150
WARMUP = 3
GARBAGE_TICKS = 10


class GcClock:
    """Time spent in garbage collection, and collections by generation, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.collections[info["generation"]] += 1


def measure(root: Path, state: Path) -> dict[str, Any]:
    cfg = {**agent_config(root, node_exporter_names()), "stateDir": str(state)}
    cfg["sinks"] = {"metrics": {"listenAddr": "127.0.0.1:0"}}
    loaded = parse_config(json.dumps(cfg), "bench-tick.yaml", env={}, host_root=root)
    agent = Agent(loaded, host_root=root)
    collectors = tier_collectors(loaded.config, "core")
    cache = MetricsCache(agent)
    ticks: list[float] = []
    renders: list[float] = []
    clock = GcClock()
    figures: dict[str, Any] = {}

    async def run() -> None:
        runners = [CollectorRunner(c, trio.CapacityLimiter(4)) for c in collectors]
        worker = ReusableThread("tier core")
        timeout = loaded.config.collector_timeout_seconds

        async def one() -> tuple[float, float]:
            began = time.process_time()
            await tier_tick(agent, "core", runners, timeout, worker)
            ticked = time.process_time()
            cache.answer(["gzip"])
            return ticked - began, time.process_time() - ticked

        for _ in range(WARMUP):
            await one()
        gc.collect()
        gc.freeze()  # as nvdaemon run's settle_heap
        gc.callbacks.append(clock)
        try:
            for _ in range(TICKS):
                tick, render = await one()
                ticks.append(tick)
                renders.append(render)
                await trio.lowlevel.checkpoint()
        finally:
            gc.callbacks.remove(clock)
        gc.disable()
        try:
            gc.collect()
            for _ in range(GARBAGE_TICKS):
                await one()
            figures["tick_garbage_objects_per_tick"] = gc.collect() / GARBAGE_TICKS
        finally:
            gc.enable()
            gc.unfreeze()
        snap = agent.snapshots["core"]
        figures["tick_files_read"] = snap.reads.reads if snap.reads is not None else 0

    logging.disable(logging.CRITICAL)  # a collector's warning per tick is not what is measured
    try:
        trio.run(run)
    finally:
        logging.disable(logging.NOTSET)
    figures.update(
        tick_core_node_cpu_ms=statistics.median(ticks) * 1e3,
        tick_render_gzip_cpu_ms=statistics.median(renders) * 1e3,
        tick_gc_ms_per_tick=clock.seconds / TICKS * 1e3,
        tick_gc_collections_per_tick=[n / TICKS for n in clock.collections],
    )
    return figures


def run() -> tuple[list[Row], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="bench-tick-") as tmp:
        root = gpunode_with_disks(Path(tmp))
        # A directory changed within SETTLED_SECONDS is read afresh, not through held descriptors
        # (collectors/heldfiles.py): the copy settles first, as it has long before any tick of a running agent.
        time.sleep(SETTLED_SECONDS + 0.5)
        raw = measure(root, Path(tmp) / "state")
    rows = [
        Row("core+node_* tick CPU in-process, gpunode (median)", raw["tick_core_node_cpu_ms"], "ms"),
        Row("gzip render after a tick, in-process (median)", raw["tick_render_gzip_cpu_ms"], "ms"),
        Row("garbage collection per tick and render", raw["tick_gc_ms_per_tick"], "ms"),
        Row("objects a tick leaves to the cycle collector", raw["tick_garbage_objects_per_tick"], ""),
    ]
    return rows, raw


if __name__ == "__main__":
    from bench.table import render

    got, figures = run()
    print(render(got))
    print(json.dumps(figures, indent=2))
