from __future__ import annotations

import shutil

import pytest

from nvdaemon.collectors.base import HostRoots
from nvdaemon.collectors.diskstats import DiskStatsCollector, is_whole_disk, parse_diskstats
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, collect, devices, find, value

WHOLE = {"nvme0n1", "sda", "dm-0"}
EVERY = WHOLE | {"nvme0n1p1", "nvme0n1p2", "sda1", "loop0"}
GO = ("disk_read_bytes_total", "disk_write_bytes_total", "disk_read_ios_total", "disk_write_ios_total")
OURS = ("disk_read_time_seconds_total", "disk_write_time_seconds_total", "disk_io_time_seconds_total")


def test_go_counters_on_every_line_ours_on_whole_disks() -> None:
    gathered, samples = collect(DiskStatsCollector(), HEALTHY)
    assert gathered.errors == []
    # The Go agent's four counters: every /proc/diskstats line, as in Go.
    for metric in GO:
        assert devices(samples, metric) == EVERY, metric
    # Ours: whole disks (partitions are not in /sys/block; loop0 is, but is skipped by name).
    for metric in (*OURS, "disk_io_in_progress"):
        assert devices(samples, metric) == WHOLE, metric
    assert value(samples, "disk_read_ios_total", "sda1") == 123000
    assert value(samples, "disk_write_bytes_total", "loop0") == 0
    assert value(samples, "disk_read_bytes_total", "loop0") == 2234 * 512
    # nvme0n1: a 20-field line.
    assert value(samples, "disk_read_ios_total", "nvme0n1") == 2345678
    assert value(samples, "disk_read_bytes_total", "nvme0n1") == 187654321 * 512
    assert value(samples, "disk_write_bytes_total", "nvme0n1") == 298765432 * 512
    assert value(samples, "disk_write_ios_total", "nvme0n1") == 3456789
    assert value(samples, "disk_read_time_seconds_total", "nvme0n1") == 456.789
    assert value(samples, "disk_write_time_seconds_total", "nvme0n1") == 1234.567
    assert value(samples, "disk_io_time_seconds_total", "nvme0n1") == 987.654
    assert value(samples, "disk_io_in_progress", "nvme0n1") == 0
    assert find(samples, "disk_io_in_progress", "nvme0n1").kind is Kind.GAUGE
    assert find(samples, "disk_read_bytes_total", "nvme0n1").kind is Kind.COUNTER
    # sda: a 14-field line; dm-0: an 18-field line.
    assert value(samples, "disk_read_bytes_total", "sda") == 23456789 * 512
    assert value(samples, "disk_io_time_seconds_total", "sda") == 65.432
    assert value(samples, "disk_write_ios_total", "dm-0") == 3690000
    assert value(samples, "disk_io_time_seconds_total", "dm-0") == 990.0


def test_faulty_queue() -> None:
    _, samples = collect(DiskStatsCollector(), FAULTY)
    assert value(samples, "disk_io_in_progress", "nvme0n1") == 37


def test_name_heuristic_without_sys_block(healthy_copy: HostRoots) -> None:
    shutil.rmtree(healthy_copy.sys / "block")
    _, samples = collect(DiskStatsCollector(), healthy_copy)
    assert devices(samples, "disk_io_time_seconds_total") == WHOLE
    assert devices(samples, "disk_read_bytes_total") == EVERY


@pytest.mark.parametrize(
    ("name", "whole"),
    [
        ("sda", True),
        ("sdaa", True),
        ("sda1", False),
        ("vdb", True),
        ("xvda", True),
        ("hda", True),
        ("nvme1n2", True),
        ("nvme1n2p3", False),
        ("mmcblk0", True),
        ("mmcblk0p1", False),
        ("md127", True),
        ("dm-3", True),
        ("loop7", False),
        ("ram0", False),
        ("zram0", False),
        ("sr0", False),
        ("fd0", False),
    ],
)
def test_name_heuristic(name: str, whole: bool) -> None:
    assert is_whole_disk(name, None) is whole


def test_sys_block_decides_but_never_for_loop() -> None:
    block = frozenset({"weird0", "loop0", "cciss!c0d0"})
    assert is_whole_disk("weird0", block)
    assert is_whole_disk("cciss/c0d0", block)
    assert not is_whole_disk("sda", block)
    assert not is_whole_disk("loop0", block)


def test_malformed_line_keeps_the_others(healthy_copy: HostRoots) -> None:
    path = healthy_copy.proc / "diskstats"
    path.write_text(path.read_text().replace("sda 123456 2345", "sda 123456 23x5"))
    gathered, samples = collect(DiskStatsCollector(), healthy_copy)
    assert len(gathered.errors) == 1
    assert "/proc/diskstats" in gathered.errors[0] and "sda" in gathered.errors[0]
    assert {s.device for s in samples} == EVERY - {"sda"}


def test_wrong_field_count_is_malformed() -> None:
    parsed = parse_diskstats("8 0 sda " + " ".join(["1"] * 12) + "\n   8 16 sdb " + " ".join(["2"] * 11) + "\n")
    assert list(parsed.devices) == ["sdb"]
    assert len(parsed.errors) == 1
