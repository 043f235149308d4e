"""How cost grows: a tier's cycle CPU and the /metrics render CPU against the number of GPUs, disks and textfile
series, with the cost per unit (a least-squares line) and how linear it is.

In-process, with the agent's own parts (as ``bench/__main__.py``'s render cost): an ``Agent`` from a config, the
tier's collectors built and configured as the tier loop builds them (``app.serve_tier``), ``collect_tier`` (the
worker thread, reads, parsing) plus ``Agent.on_snapshot`` (the rules, the snapshot swap) as *cycle CPU*, then
``MetricsCache.render`` of the exposition the new snapshot changed as *render CPU*. CPU is this process's
(``time.process_time``: every thread, children not included), per cycle and per render. An axis's three points run
side by side in one process, in rounds of one cycle and one render of each, each point first in turn (a change in
the machine's load then touches every point alike); after the warm-up rounds, rounds repeat until the dearest
point has spent BUDGET seconds of CPU (within the axis's fewest and most), and each figure is the mean over them.

- GPUs (1, 8, 64): the gpu tier alone on the fake NVML (``nvdaemon/nvml/fake.py``), replaying
  ``fixtures/nvml/h100-8gpu-healthy.json``'s devices repeated to N (each its own UUID and PCI address), dcgmCompat
  on, the rules of ``examples/gpu.yaml``.
- Disks (4, 24, 60): the smart tier alone with the smartctl stand-in (``fixtures/smartctl/smartctl``), on a dev/ of
  N whole disks, half ``sdX`` and half ``nvmeXn1``, each answering with a copy of a fixture recording (the SATA or
  NVMe ones in turn) with a serial number of its own; smartctlCompat on, ``smart.maxConcurrent`` at its default,
  the rules of ``examples/smart.yaml``; one warm-up cycle (the first detects each disk's type). The stand-in's own
  CPU (a Python script standing in for a C tool) is a child process, not counted; starting it and reading its
  output is.
- Textfile series (10, 100, 1,000): the core tier on ``fixtures/hosts/gpunode`` with the node_exporter surface
  reduced to its textfile collector, reading *.prom files of 100 series at most, in families of 10 gauges.

Per series: the least-squares slope (cost per unit) and intercept (the cost at zero units: the tier's fixed
cost), and the per-unit cost between the middle and the large point over that between the small and the middle
point (1.0: linear; above: each unit costs more as units are added). ``python -m bench.growth`` runs it alone.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio
import yaml

from bench.common import FIXTURES, ROOT
from bench.table import Row
from nvdaemon.app import Agent
from nvdaemon.collectors import collectors_for_tier
from nvdaemon.compat.node_exporter import TABLE as NODE_EXPORTER_TABLE
from nvdaemon.compat.node_exporter.options import DEFAULTS
from nvdaemon.compat.node_exporter.surface import node_exporter_collectors
from nvdaemon.configload import parse_config
from nvdaemon.gpu import open_gpu
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.tiers import CollectorRunner, collect_tier

STANDIN = FIXTURES / "smartctl" / "smartctl"
RECORDINGS = FIXTURES / "smartctl" / "recordings"
GPU_SCENARIO = FIXTURES / "nvml" / "h100-8gpu-healthy.json"
GPUNODE = FIXTURES / "hosts" / "gpunode"
SERIES_PER_FILE = 100
SERIES_PER_FAMILY = 10


@dataclass(frozen=True)
class Axis:
    key: str  # raw figures' prefix
    tier: str
    unit: str  # what one unit is, singular
    plural: str
    points: tuple[int, int, int]
    reps: tuple[int, int]  # at least, at most: rounds are repeated until BUDGET seconds of CPU or the most
    warmup: int = 3  # cycles before measuring (the first ones fill caches, the first SMART cycle detects types)


BUDGET = 2.0  # CPU seconds of cycles and renders of the dearest point: the cheap ones get as many cycles
AXES = (
    Axis("gpus", "gpu", "GPU", "GPUs", (1, 8, 64), (20, 400)),
    Axis("disks", "smart", "disk", "disks", (4, 24, 60), (4, 6), warmup=1),  # a cycle runs smartctl on every disk
    Axis("textfile", "core", "series", "textfile series", (10, 100, 1000), (20, 400)),
)


# ---- the inputs of N units --------------------------------------------------------------------------------------
def gpu_scenario(n: int, into: Path) -> Path:
    """The healthy 8-GPU scenario's devices repeated to ``n`` GPUs, each with its own UUID and PCI bus."""
    doc = json.loads(GPU_SCENARIO.read_text())
    base = doc["devices"]
    devices = []
    for i in range(n):
        dev = dict(base[i % len(base)])
        dev["uuid"] = f"GPU-{i:08x}-0000-4000-8000-000000000000"
        dev["pciBusId"] = f"00000000:{0x10 + i:02X}:00.0"
        devices.append(dev)
    path = into / f"gpus-{n}.json"
    path.write_text(json.dumps({**doc, "devices": devices, "steps": []}))
    return path


def disk_names(n: int) -> list[str]:
    """``n`` whole disks: the first half sda, sdb, .. (sdaa after sdz), the rest nvme0n1, nvme1n1, .."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    sata = [f"sd{letters[i]}" if i < 26 else f"sd{letters[i // 26 - 1]}{letters[i % 26]}" for i in range(n // 2)]
    return sata + [f"nvme{i}n1" for i in range(n - len(sata))]


def disks(n: int, into: Path) -> tuple[Path, Path]:
    """A dev/ of ``n`` whole disks and the stand-in's recordings for them: (dev, recordings)."""
    dev, recordings = into / f"disks-{n}" / "dev", into / f"disks-{n}" / "recordings"
    dev.mkdir(parents=True)
    for i, name in enumerate(disk_names(n)):
        (dev / name).touch()
        source = RECORDINGS / (("sda", "sdb") if name.startswith("sd") else ("nvme0n1", "nvme1n1"))[i % 2]
        target = recordings / name
        target.mkdir(parents=True)
        for part in ("type", "rc"):
            (target / part).write_bytes((source / part).read_bytes())
        lines = (source / "all.txt").read_text().splitlines(keepends=True)
        serial = next(j for j, line in enumerate(lines) if line.startswith("Serial Number:"))
        lines[serial] = f"Serial Number:    BENCH{i:05d}\n"
        (target / "all.txt").write_text("".join(lines))
    return dev, recordings


def textfiles(n: int, into: Path) -> Path:
    """A textfile directory holding ``n`` gauge series: files of SERIES_PER_FILE, families of SERIES_PER_FAMILY."""
    directory = into / f"textfile-{n}"
    directory.mkdir()
    for first in range(0, n, SERIES_PER_FILE):
        lines = []
        for i in range(first, min(n, first + SERIES_PER_FILE)):
            family = f"bench_growth_f{i // SERIES_PER_FAMILY}"
            if i % SERIES_PER_FAMILY == 0:
                lines += [f"# HELP {family} A series of the growth benchmark.", f"# TYPE {family} gauge"]
            lines.append(f'{family}{{job="batch",slot="{i % SERIES_PER_FAMILY}"}} {i * 1.5}')
        (directory / f"f{first // SERIES_PER_FILE:03d}.prom").write_text("\n".join(lines) + "\n")
    return directory


def rules(name: str) -> list[Any]:
    found: list[Any] = yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())["rules"]
    return found


def config(axis: Axis, n: int, tmp: Path) -> dict[str, Any]:
    state = tmp / f"state-{axis.key}-{n}"
    if axis.key == "gpus":
        return {
            "tiers": ["gpu"],
            "gpu": {"backend": "fake", "fakeScenario": str(gpu_scenario(n, tmp)), "xid": False},
            "dcgmCompat": {"enabled": True},
            "rules": rules("gpu"),
            "stateDir": str(state),
        }
    if axis.key == "disks":
        dev, _ = disks(n, tmp)
        return {
            "tiers": ["smart"],
            "devRoot": str(dev),
            "smart": {"smartctlPath": str(STANDIN), "timeoutSeconds": 30},
            "smartctlCompat": {"enabled": True},
            "rules": rules("smart"),
            "stateDir": str(state),
        }
    return {
        "tiers": ["core"],
        "procRoot": str(GPUNODE / "proc"),
        "sysRoot": str(GPUNODE / "sys"),
        "nodeExporter": {
            "enabled": True,
            "textfileDirectory": str(textfiles(n, tmp)),
            "collectors": {name: name == "textfile" for name in DEFAULTS},
        },
        "stateDir": str(state),
    }


@contextmanager
def standin_recordings(directory: Path | None) -> Iterator[None]:
    """The stand-in smartctl reads its recordings from $SMARTCTL_STANDIN_DIR: point it at ``directory`` meanwhile."""
    if directory is None:
        yield
        return
    before = os.environ.get("SMARTCTL_STANDIN_DIR")
    os.environ["SMARTCTL_STANDIN_DIR"] = str(directory)
    try:
        yield
    finally:
        if before is None:
            del os.environ["SMARTCTL_STANDIN_DIR"]
        else:
            os.environ["SMARTCTL_STANDIN_DIR"] = before


# ---- the points of an axis, side by side ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    figures: dict[str, float]  # mean cycle and render CPU (ms), cycles measured, samples and bytes of the last one
    exposition: bytes  # the last render


class _Tier:
    """One point: an agent with ``n`` units, its tier's runners (built as ``app.serve_tier`` builds them), its
    /metrics cache, and the CPU its cycles and renders took."""

    def __init__(self, axis: Axis, n: int, tmp: Path) -> None:
        self.axis, self.n = axis, n
        self.agent = Agent(parse_config(json.dumps({"node": "bench-node", **config(axis, n, tmp)}), "bench", env={}))
        self.recordings = tmp / f"disks-{n}" / "recordings" if axis.key == "disks" else None
        self.runners: list[CollectorRunner] = []
        self.cache = MetricsCache(self.agent)
        self.cycle = self.render = 0.0
        self.done = -axis.warmup
        self.samples = 0
        self.body = b""

    async def open(self) -> None:
        agent, cfg = self.agent, self.agent.loaded.config
        start = await open_gpu(cfg.gpu, agent.active_tiers(), node=agent.node, emit=agent.emit, next_seq=agent.next_seq)
        agent.gpu = rt = start.runtime
        limiter = rt.limiter if rt is not None else trio.CapacityLimiter(4)
        collectors = rt.collectors() if rt is not None else collectors_for_tier(self.axis.tier)
        if self.axis.tier == "core":
            collectors += node_exporter_collectors(cfg, NODE_EXPORTER_TABLE)
        for c in collectors:
            c.configure(cfg)
        self.runners = [CollectorRunner(c, limiter) for c in collectors]

    async def once(self) -> None:
        """One cycle (collect + the snapshot into the agent) and one render; timed once past the warm-up."""
        agent = self.agent
        with standin_recordings(self.recordings):
            t0 = time.process_time()
            snap = await collect_tier(
                self.axis.tier, self.runners, agent.roots, agent.loaded.config.collector_timeout_seconds
            )
            agent.on_snapshot(snap)
            t1 = time.process_time()
            self.body = self.cache.render()
            t2 = time.process_time()
        if self.done >= 0:
            self.cycle += t1 - t0
            self.render += t2 - t1
        self.done += 1
        self.samples = len(snap.samples)
        if failing := [name for name, st in snap.collectors.items() if not st.success]:
            raise RuntimeError(f"growth {self.axis.key}={self.n}: collector(s) failing: {failing}")

    def point(self) -> Point:
        figures = {
            "cycle_ms": self.cycle / self.done * 1000,
            "render_ms": self.render / self.done * 1000,
            "cycles": self.done,
            "samples": self.samples,
            "exposition_bytes": len(self.body),
        }
        return Point(figures, self.body)


def measure(axis: Axis, tmp: Path, points: tuple[int, ...] | None = None) -> dict[int, Point]:
    """Each point of ``axis`` (or ``points``), measured in turns: a cycle and a render of each in every round, so
    a change in the machine's load while it runs touches every point alike."""

    async def main() -> dict[int, Point]:
        tiers = [_Tier(axis, n, tmp) for n in points or axis.points]
        for t in tiers:
            await t.open()
        fewest, most = axis.reps
        turn = 0
        while True:
            done = tiers[0].done
            spent = max(t.cycle + t.render for t in tiers)
            if done >= most or (done >= fewest and spent >= BUDGET):
                break
            # Each point goes first in turn: the one after the largest render would otherwise always find the
            # caches that render left.
            for t in tiers[turn:] + tiers[:turn]:
                await t.once()
            turn = (turn + 1) % len(tiers)
        return {t.n: t.point() for t in tiers}

    return trio.run(main)


# ---- the line -----------------------------------------------------------------------------------------------------
def fit(xs: tuple[int, ...], ys: list[float]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of ys over xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def run() -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="nvdaemon-growth-") as name:
        tmp = Path(name)
        for axis in AXES:
            got = {n: p.figures for n, p in measure(axis, tmp).items()}
            for n, figures in got.items():
                raw.update({f"growth_{axis.key}_{n}_{k}": v for k, v in figures.items()})
            lo, mid, hi = axis.points
            for what, label in (("cycle", f"{axis.tier} cycle CPU"), ("render", "render CPU")):
                ys = [got[n][f"{what}_ms"] for n in axis.points]
                slope, intercept = fit(axis.points, ys)
                low = (ys[1] - ys[0]) / (mid - lo)  # per unit from the small to the middle point
                high = (ys[2] - ys[1]) / (hi - mid)  # and from the middle to the large
                key = f"growth_{axis.key}_{what}"
                raw[f"{key}_us_per_unit"] = slope * 1000
                raw[f"{key}_intercept_ms"] = intercept
                raw[f"{key}_segment_us_per_unit"] = [low * 1000, high * 1000]
                raw[f"{key}_linearity"] = high / low if low else float("nan")
                points = "/".join(f"{n:,}" for n in axis.points)
                head = f"{label}, {points} {axis.plural}"
                rows += [
                    Row(f"{head}: per {axis.unit} (lsq)", slope * 1000, "us"),
                    Row(f"{head}: fixed (intercept)", intercept, "ms"),
                    Row(f"{head}: per {axis.unit} {mid:,}->{hi:,} vs {lo:,}->{mid:,}", high * 1000, "us", low * 1000),
                ]
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
