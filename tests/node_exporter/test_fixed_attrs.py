"""hwmon and cpufreq read what a driver fixes once per device directory, and everything else every scrape.

Each test runs scrapes the way the core tier does (a fresh ``CycleReads`` per tick) on a copy of gpunode's sysfs,
changes the host between two of them, and checks the next scrape. A device replaced by another is a new directory
(sysfs gives it a new inode): its fixed attributes are read again. What an administrator writes is read every tick.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nvdaemon.collectors.base import CYCLE_READS, CycleReads, HostRoots
from nvdaemon.collectors.hwmon import HwmonCollector
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NodeCollector, NodeContext
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.config import NodeExporterConfig
from nvdaemon.model import Sample
from tests.node_exporter.conftest import HOSTS

T = TypeVar("T")
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]
CORETEMP = "devices/platform/coretemp.0/hwmon/hwmon0"  # class/hwmon/hwmon0 links here
POLICY0 = "devices/system/cpu/cpufreq/policy0"  # cpu0/cpufreq links here


def gpunode_sys(tmp_path: Path) -> HostRoots:
    root = tmp_path / "host"
    shutil.copytree(HOSTS / "gpunode" / "sys", root / "sys", symlinks=True)
    return HostRoots.under(root)


def in_cycle(fn: Callable[[], T]) -> tuple[T, list[str]]:
    """``fn()`` in a tick of its own, and the files the tick read."""
    reads = CycleReads()
    token = CYCLE_READS.set(reads)
    try:
        return fn(), reads.paths
    finally:
        CYCLE_READS.reset(token)


def node_scrape(collector: NodeCollector, roots: HostRoots) -> tuple[Series, list[str]]:
    """One scrape of a node_exporter collector: its series and the files it read."""

    def collect() -> Series:
        out: list[Family] = []
        collector.collect(NodeContext(roots, NodeExporterConfig(enabled=True)), out)
        return {(fam.name, labels): value for fam in out for labels, value in fam.samples}

    return in_cycle(collect)


def hw_tick(collector: HwmonCollector, roots: HostRoots) -> tuple[list[Sample], list[str]]:
    return in_cycle(lambda: list(collector.interpret(collector.gather(roots), 0.0).samples))


def replace_directory(path: Path, build: Callable[[Path], None]) -> None:
    """Put a directory built by ``build`` where ``path`` was, as a driver reload does: the old one is still there
    while the new one is made, so the new one has another inode."""
    fresh = path.with_name(path.name + ".new")
    fresh.mkdir()
    build(fresh)
    before = path.stat().st_ino
    path.rename(path.with_name(path.name + ".old"))
    fresh.rename(path)
    assert path.stat().st_ino != before


def nct6775(chip: Path) -> None:
    """A SuperIO chip where coretemp was: another parent device, another name, other labels."""
    (chip.parents[2] / "nct6775.656").mkdir()
    os.symlink("../../../nct6775.656", chip / "device")
    for name, text in {
        "name": "nct6775",
        "temp1_input": "31000",
        "temp1_label": "SYSTIN",
        "temp1_max": "80000",
    }.items():
        (chip / name).write_text(text + "\n")


def test_hwmon_chip_replaced_is_reported_under_its_new_name_next_scrape(tmp_path: Path) -> None:
    roots = gpunode_sys(tmp_path)
    hwmon = TABLE["hwmon"]()  # the agent keeps its collectors from tick to tick
    first, _ = node_scrape(hwmon, roots)
    old = (("chip", "platform_coretemp_0"), ("chip_name", "coretemp"))
    assert first[("node_hwmon_chip_names", old)] == 1
    replace_directory(roots.sys / CORETEMP, nct6775)
    after, _ = node_scrape(hwmon, roots)
    assert ("node_hwmon_chip_names", old) not in after
    assert after[("node_hwmon_chip_names", (("chip", "platform_nct6775_656"), ("chip_name", "nct6775")))] == 1
    sensor = (("chip", "platform_nct6775_656"), ("sensor", "temp1"))
    assert after[("node_hwmon_temp_celsius", sensor)] == 31.0
    assert after[("node_hwmon_sensor_label", (sensor[0], ("label", "SYSTIN"), sensor[1]))] == 1
    assert not [key for key in after if ("chip", "platform_coretemp_0") in key[1]]


def test_hwmon_threshold_written_is_seen_next_scrape_and_fixed_files_are_read_once(tmp_path: Path) -> None:
    roots = gpunode_sys(tmp_path)
    sensor = (("chip", "platform_coretemp_0"), ("sensor", "temp1"))
    hwmon = TABLE["hwmon"]()
    first, first_paths = node_scrape(hwmon, roots)
    assert first[("node_hwmon_temp_max_celsius", sensor)] == 90.0
    (roots.sys / CORETEMP / "temp1_max").write_text("85000\n")  # what `sensors -s` or an admin writes
    after, paths = node_scrape(hwmon, roots)
    assert after[("node_hwmon_temp_max_celsius", sensor)] == 85.0
    fixed = [p for p in paths if p.endswith(("/name", "_label"))]
    assert [p for p in first_paths if p.endswith(("/name", "_label"))] and fixed == []
    assert any(p.endswith("/temp1_input") for p in paths)


def test_hwmon_sensor_file_added_is_seen_next_scrape(tmp_path: Path) -> None:
    """The files a chip directory's sensors are read from are planned once per listing: a file that appears (a
    driver's attribute group made visible) changes the listing, and the next scrape reads by a new plan. (A file
    that goes needs no new plan to be missed: its read finds it gone.)"""
    roots = gpunode_sys(tmp_path)
    hwmon = TABLE["hwmon"]()
    first, _ = node_scrape(hwmon, roots)
    sensor = (("chip", "platform_coretemp_0"), ("sensor", "temp1"))
    assert ("node_hwmon_temp_min_celsius", sensor) not in first
    (roots.sys / CORETEMP / "temp1_min").write_text("5000\n")
    added, paths = node_scrape(hwmon, roots)
    assert added[("node_hwmon_temp_min_celsius", sensor)] == 5.0
    assert set(added) - set(first) == {("node_hwmon_temp_min_celsius", sensor)}
    assert any(p.endswith("/temp1_min") for p in paths)


def test_hw_hwmon_chip_replaced_and_threshold_written(tmp_path: Path) -> None:
    roots = gpunode_sys(tmp_path)
    collector = HwmonCollector()
    first, first_paths = hw_tick(collector, roots)
    assert {s.device for s in first if s.device.startswith("hwmon0/")} >= {"hwmon0/coretemp/temp1"}
    (roots.sys / CORETEMP / "temp1_crit").write_text("95000\n")
    second, paths = hw_tick(collector, roots)
    assert [s.value for s in second if s.metric == "temp_crit_celsius" and s.device == "hwmon0/coretemp/temp1"] == [
        95.0
    ]
    assert [p for p in first_paths if p.endswith(("/name", "_label"))]
    assert [p for p in paths if p.endswith(("/name", "_label"))] == []  # read once per chip directory
    replace_directory(roots.sys / CORETEMP, nct6775)
    third, _ = hw_tick(collector, roots)
    assert sorted((s.metric, s.device, s.value, s.labels) for s in third if s.device.startswith("hwmon0/")) == [
        ("hwmon_sensor_info", "hwmon0/nct6775/temp1", 1.0, (("label", "SYSTIN"),)),
        ("temp_celsius", "hwmon0/nct6775/temp1", 31.0, ()),
    ]


def frequency(series: Series, family: str, cpu: str = "0") -> float:
    return series[(family, (("cpu", cpu),))]


def test_cpufreq_limits_written_are_seen_next_scrape(tmp_path: Path) -> None:
    roots = gpunode_sys(tmp_path)
    policy = roots.sys / POLICY0
    cpufreq = TABLE["cpufreq"]()
    first, first_paths = node_scrape(cpufreq, roots)
    assert frequency(first, "node_cpu_scaling_frequency_max_hertz") == 3.101e9
    (policy / "scaling_max_freq").write_text("2000000\n")  # cpupower frequency-set -u 2GHz
    (policy / "cpuinfo_max_freq").write_text("2400000\n")  # what turning boost off does to it
    after, paths = node_scrape(cpufreq, roots)
    assert frequency(after, "node_cpu_scaling_frequency_max_hertz") == 2e9
    assert frequency(after, "node_cpu_frequency_max_hertz") == 2.4e9
    fixed = ("/cpuinfo_min_freq", "/scaling_driver", "/related_cpus", "/scaling_available_governors")
    assert [p for p in first_paths if p.endswith(fixed)]
    assert [p for p in paths if p.endswith(fixed)] == []  # read once per policy directory
    assert any(p.endswith("/scaling_governor") for p in paths)


def test_cpufreq_policy_replaced_is_read_afresh(tmp_path: Path) -> None:
    roots = gpunode_sys(tmp_path)
    policy = roots.sys / POLICY0
    cpufreq = TABLE["cpufreq"]()
    first, _ = node_scrape(cpufreq, roots)
    assert frequency(first, "node_cpu_frequency_min_hertz") == 8e8

    def other_driver(fresh: Path) -> None:
        for entry in policy.iterdir():
            shutil.copy(entry, fresh / entry.name)
        (fresh / "cpuinfo_min_freq").write_text("400000\n")

    replace_directory(policy, other_driver)
    after, _ = node_scrape(cpufreq, roots)
    assert frequency(after, "node_cpu_frequency_min_hertz") == 4e8
    assert frequency(after, "node_cpu_frequency_min_hertz", "1") == 8e8  # policy1 is the same directory
