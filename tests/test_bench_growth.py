"""bench/growth.py and bench/steady.py's own logic: the inputs of N units really hold N units, and one point of each
axis runs through the agent's tier and /metrics code (so a change there that the benchmark no longer follows fails
here, not in a ``make bench`` run). No timing is asserted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import growth, steady
from nvdaemon.collectors.smart import discover
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.promtext import parse_text

AXES = {axis.key: axis for axis in growth.AXES}


def one_cycle(key: str) -> growth.Axis:
    """The axis measured over one cycle, with no warm-up."""
    a = AXES[key]
    return growth.Axis(a.key, a.tier, a.unit, a.plural, a.points, (1, 1), warmup=0)


def test_fit_recovers_a_line() -> None:
    slope, intercept = growth.fit((1, 8, 64), [0.5 + 0.25 * x for x in (1, 8, 64)])
    assert slope == pytest.approx(0.25)
    assert intercept == pytest.approx(0.5)


@pytest.mark.parametrize("n", [4, 24, 60])
def test_disks_are_n_whole_disks_with_their_own_serials(tmp_path: Path, n: int) -> None:
    dev, recordings = growth.disks(n, tmp_path)
    names = discover(dev)
    assert len(names) == n
    assert sorted(names) == sorted(p.name for p in recordings.iterdir())
    serials = {re.search(r"^Serial Number:\s+(\S+)", (recordings / d / "all.txt").read_text(), re.M)[1] for d in names}  # type: ignore[index]
    assert len(serials) == n


def test_gpu_scenario_has_n_distinct_gpus(tmp_path: Path) -> None:
    identities = FakeNvml(growth.gpu_scenario(64, tmp_path)).open()
    assert len(identities) == 64
    assert len({g.uuid for g in identities}) == len({g.pci_bus_id for g in identities}) == 64


@pytest.mark.parametrize("n", [10, 100, 250])
def test_textfiles_hold_n_series(tmp_path: Path, n: int) -> None:
    directory = growth.textfiles(n, tmp_path)
    series = [
        m for f in sorted(directory.glob("*.prom")) for fam in parse_text(f.read_bytes()).values() for m in fam.metrics
    ]
    assert len(series) == n


def test_gpu_point_collects_and_renders_every_gpu(tmp_path: Path) -> None:
    got = growth.measure(one_cycle("gpus"), tmp_path, (1, 3))
    one, three = got[1], got[3]
    assert one.figures["cycles"] == 1
    assert one.figures["samples"] > 0
    assert three.figures["samples"] == 3 * one.figures["samples"]
    temps = re.findall(rb"^DCGM_FI_DEV_GPU_TEMP\{gpu=\"(\d+)\"", three.exposition, re.M)
    assert sorted(temps) == [b"0", b"1", b"2"]


def test_disk_point_reads_every_disk(tmp_path: Path) -> None:
    point = growth.measure(one_cycle("disks"), tmp_path, (4,))[4]
    serials = set(re.findall(rb'serial_number="(BENCH\d+)"', point.exposition))
    assert serials == {b"BENCH00000", b"BENCH00001", b"BENCH00002", b"BENCH00003"}


def test_textfile_point_exposes_every_series(tmp_path: Path) -> None:
    point = growth.measure(one_cycle("textfile"), tmp_path, (25,))[25]
    assert len(re.findall(rb"^bench_growth_f\d+\{", point.exposition, re.M)) == 25


def test_steady_window_is_whole_intervals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_STEADY_SECONDS", raising=False)
    assert steady.seconds() == 300
    monkeypatch.setenv("BENCH_STEADY_SECONDS", "100")
    assert steady.seconds() == 105
    monkeypatch.setenv("BENCH_STEADY_SECONDS", "1")
    assert steady.seconds() == 15


def test_tick_stamps_per_tier() -> None:
    body = (
        b'nodevitals_tier_last_tick_timestamp_seconds{tier="core"} 1.7e+09\n'
        b'nodevitals_tier_last_tick_timestamp_seconds{tier="smart"} 1.6e+09\n'
        b'nodevitals_tier_interval_seconds{tier="core"} 15.0\n'
    )
    assert steady.tick_stamps(body) == [("core", "1.7e+09"), ("smart", "1.6e+09")]
