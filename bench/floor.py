"""The collection floor: CPU per core-tier cycle against just reading the same files into memory.

A core-tier cycle (``collect_tier`` with the nine ``nodevitals_hw_*`` collectors: /proc and other kernel-memory
reads on the event loop, hwmon and RAPL in a worker thread under the timeout, read, parse, interpret, the cycle's
shared read cache) is run CYCLES times after a warm-up, and its process CPU time per cycle
measured. The floor is the least any agent must spend for the same data: the files that cycle read (the paths its
``CycleReads`` recorded), each opened and read whole as bytes, one after the other in one thread, with no parsing,
CYCLES times. The directory listings the collectors do to find hwmon chips, PCI devices and RAPL zones are not in
the floor (they are not file reads), so the floor is a little lower than the true minimum.

To show where a cycle's CPU goes, each collector's ``gather`` + ``interpret`` is also run directly in this thread
(no worker thread, no Trio, no shared cache), CYCLES times: the sum of those is the cost of reading and parsing;
the rest of a cycle is orchestration (thread hand-offs, the timeout scopes, statuses, the snapshot). The same calls
made in turn, as a cycle makes them (``cycle_direct_in_turn_cpu_ms``), cost more than that sum: one collector called
200 times in a row keeps its code and data in the CPU's caches. The split of
the collectors between the event loop (reads that cannot hang) and the worker thread is measured against the way
before it, every collector in the worker thread (``cycle_all_in_thread_cpu_ms``), in the same run.

It runs twice: on this machine's /proc and /sys (or ``BENCH_HOST_ROOT``), and on ``fixtures/hosts/gpunode`` (the
host of the scrape benchmark: hwmon chips, PCI devices and RAPL zones that a container often lacks).
``python -m bench.floor`` runs it alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import trio

from bench.common import FIXTURES
from bench.table import Row, Target
from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import Collector, Gathered, HostRoots, Interpreted, NotPresent
from nvdaemon.tiers import CollectorRunner, collect_tier

CYCLES = 200
WARMUP = 5
TARGET = Target("ratio", "<=", 3.0)


GPUNODE = FIXTURES / "hosts" / "gpunode"


def hosts() -> list[tuple[str, HostRoots]]:
    """(label, roots): this machine (or BENCH_HOST_ROOT), then the gpunode fixture host."""
    env = os.environ.get("BENCH_HOST_ROOT")
    first = (Path(env).name, HostRoots.under(Path(env))) if env else ("this host", HostRoots())
    return [first, ("gpunode", HostRoots.under(GPUNODE))]


class InThread(Collector):
    """A collector as every one was before the loop/thread split: gathered in the worker thread, never skipped as
    absent before its gather."""

    may_hang = True

    def __init__(self, inner: Collector) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]  # per-instance name, as the node_exporter collectors have

    def gather(self, roots: HostRoots) -> Gathered:
        return self.inner.gather(roots)

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        return self.inner.interpret(gathered, now)


def cycle_cpu(roots: HostRoots, all_in_thread: bool = False) -> tuple[dict[str, Any], list[Path]]:
    """Mean process CPU and wall time per core-tier cycle, and the files one cycle read."""

    async def main() -> tuple[dict[str, Any], list[Path]]:
        limiter = trio.CapacityLimiter(4)
        collectors = collectors_for_tier("core")
        if all_in_thread:
            collectors = [InThread(c) for c in collectors]
        runners = [CollectorRunner(c, limiter) for c in collectors]
        for _ in range(WARMUP):
            await collect_tier("core", runners, roots, 5.0)
        paths: list[Path] = []
        samples = 0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(CYCLES):
            snap = await collect_tier("core", runners, roots, 5.0)
            samples = len(snap.samples)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if snap.reads is not None:
            paths = [Path(p) for p in snap.reads.paths]
        failing = sorted(name for name, st in snap.collectors.items() if not st.success)
        figures = {
            "cycle_cpu_ms": cpu / CYCLES * 1000,
            "cycle_wall_ms": wall / CYCLES * 1000,
            "cycle_samples": samples,
            "cycle_files": len(paths),
            "cycle_failing_collectors": ",".join(failing) or "-",
            "cycle_on_loop_collectors": ",".join(c.name for c in collectors if not c.may_hang) or "-",
        }
        return figures, paths

    return trio.run(main)


def read_floor(paths: list[Path]) -> float:
    """Mean process CPU seconds to read every path once (bytes, whole file, no parsing), over CYCLES rounds."""

    def once() -> None:
        for path in paths:
            try:
                with open(path, "rb") as f:
                    f.read()
            except OSError:
                pass  # a file the collectors also failed on (they count it); the floor still tried it

    for _ in range(WARMUP):
        once()
    cpu0 = time.process_time()
    for _ in range(CYCLES):
        once()
    return (time.process_time() - cpu0) / CYCLES


def direct_cpu(roots: HostRoots) -> dict[str, float]:
    """Mean process CPU ms per call of each core collector's gather + interpret, called directly in this thread."""
    out: dict[str, float] = {}
    for collector in collectors_for_tier("core"):

        def once(c: Collector = collector) -> None:
            with contextlib.suppress(NotPresent):
                c.interpret(c.gather(roots), time.time())

        for _ in range(WARMUP):
            once()
        cpu0 = time.process_time()
        for _ in range(CYCLES):
            once()
        out[collector.name] = (time.process_time() - cpu0) / CYCLES * 1000
    return out


def direct_in_turn_cpu(roots: HostRoots) -> float:
    """Mean process CPU ms per round of every core collector's gather + interpret called directly in this thread, one
    after the other as a cycle calls them. Run one collector 200 times in a row (``direct_cpu``) and its code and data
    stay in the CPU's caches; in a cycle they do not, so this is the part of a cycle that is reading and parsing."""
    collectors = collectors_for_tier("core")

    def once() -> None:
        for c in collectors:
            with contextlib.suppress(NotPresent):
                c.interpret(c.gather(roots), time.time())

    for _ in range(WARMUP):
        once()
    cpu0 = time.process_time()
    for _ in range(CYCLES):
        once()
    return (time.process_time() - cpu0) / CYCLES * 1000


def measure(roots: HostRoots) -> dict[str, Any]:
    before, _ = cycle_cpu(roots, all_in_thread=True)
    raw, paths = cycle_cpu(roots)
    raw["cycle_all_in_thread_cpu_ms"] = before["cycle_cpu_ms"]
    raw["floor_read_cpu_ms"] = read_floor(paths) * 1000
    direct = direct_cpu(roots)
    raw["cycle_direct_cpu_ms"] = sum(direct.values())
    raw["cycle_orchestration_cpu_ms"] = raw["cycle_cpu_ms"] - raw["cycle_direct_cpu_ms"]
    raw["cycle_direct_in_turn_cpu_ms"] = direct_in_turn_cpu(roots)
    raw["cycle_orchestration_in_turn_cpu_ms"] = raw["cycle_cpu_ms"] - raw["cycle_direct_in_turn_cpu_ms"]
    raw.update({f"cycle_direct_{name}_cpu_ms": ms for name, ms in direct.items()})
    return raw


def run() -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for label, roots in hosts():
        figures = measure(roots)
        key = "host" if label == "this host" else label
        raw.update({f"{key}_{name}": value for name, value in figures.items()})
        rows.append(
            Row(
                f"core cycle CPU vs read floor ({label}, {figures['cycle_files']} files)",
                figures["cycle_cpu_ms"],
                "ms",
                figures["floor_read_cpu_ms"],
                TARGET,
            )
        )
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
