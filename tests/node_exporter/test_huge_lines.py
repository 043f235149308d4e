"""Huge lines under the host-file caps, on the node_exporter surface: a line of megabytes in /proc/loadavg,
/proc/stat, /proc/meminfo, /proc/vmstat, /proc/schedstat and the /proc tables fails each collector reading it
(``node_scrape_collector_success`` 0, the agent's error counted), and parsing it costs no more than reading it.
A few bytes that name a huge number of CPUs (``cpu65535``, an isolated list of ranges) stay bounded too.

Memory is measured with tracemalloc (deterministic Python allocations): the read plus a few MiB, against hundreds.
"""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path

import msgspec
import pytest
import trio

from nvdaemon.collectors.base import HostRoots
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, render
from nvdaemon.compat.node_exporter.surface import NodeExporterCollector, surface_families
from nvdaemon.config import NodeExporterConfig
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.node_exporter.conftest import HOSTS

MiB = 1024 * 1024
SLACK = 4 * MiB
OPTIONS = msgspec.convert({"enabled": True}, NodeExporterConfig)


def numbers(size: int) -> bytes:
    return (b"12 " * (size // 3 + 1))[:size]


def gpunode(tmp_path: Path) -> HostRoots:
    shutil.copytree(HOSTS / "gpunode", tmp_path / "host", symlinks=True)
    return HostRoots.under(tmp_path / "host")


# node_exporter collector -> (file under proc, text before the huge line, its size); the line is appended.
HUGE = {
    "loadavg": ("loadavg", b"", 4_000_000),
    "stat": ("stat", b"softirq ", 4_000_000),
    "cpu": ("stat", b"softirq ", 4_000_000),
    "meminfo": ("meminfo", b"Huge: ", 4_000_000),
    "vmstat": ("vmstat", b"", 4_000_000),
    "schedstat": ("schedstat", b"", 4_000_000),
    "netdev": ("net/dev", b"  eth9: ", 12_000_000),
    "diskstats": ("diskstats", b"   8 0 sdz ", 12_000_000),
}


def poison(roots: HostRoots, name: str) -> Path:
    rel, head, size = HUGE[name]
    path = roots.proc / rel
    kept = b"" if name == "loadavg" else path.read_bytes()
    path.write_bytes(kept + head + numbers(size) + b"\n")
    return path


def collect_peak(roots: HostRoots, name: str) -> tuple[int, BaseException | None]:
    """Peak bytes allocated by one ``collect`` of a node_exporter collector, and what it raised."""
    impl = TABLE[name]()
    error: BaseException | None = None
    tracemalloc.start()
    try:
        impl.collect(NodeContext(roots, OPTIONS), [])
    except Exception as exc:
        error = exc
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak, error


@pytest.mark.parametrize("name", sorted(HUGE))
def test_a_huge_line_fails_the_collector_within_the_read(tmp_path: Path, name: str) -> None:
    roots = gpunode(tmp_path)
    assert collect_peak(roots, name)[1] is None  # the fixture itself collects
    path = poison(roots, name)
    size = path.stat().st_size
    peak, error = collect_peak(roots, name)
    assert peak < 2 * size + SLACK, f"{name}: {peak / MiB:.1f} MiB for a {size / MiB:.1f} MiB file"
    assert error is not None, name


async def test_huge_lines_are_failed_scrapes_and_counted_errors(tmp_path: Path) -> None:
    roots = gpunode(tmp_path)
    for name in ("loadavg", "meminfo", "stat", "vmstat", "netdev"):
        poison(roots, name)
    collectors = []
    for name in ("loadavg", "meminfo", "stat", "cpu", "vmstat", "netdev", "uname"):
        c = NodeExporterCollector(name, TABLE[name]())
        c.options = OPTIONS
        collectors.append(c)
    runners = [CollectorRunner(c, trio.CapacityLimiter(1)) for c in collectors]
    snap = await collect_tier("core", runners, roots, 30.0)
    text = render(surface_families(snap)).decode()
    for name in ("loadavg", "meminfo", "stat", "cpu", "vmstat", "netdev"):
        status = snap.collectors[f"node_exporter.{name}"]
        assert not status.success and status.error_total == 1, (name, status.errors)
        assert " longer than " in status.errors[0], status.errors
        assert f'node_scrape_collector_success{{collector="{name}"}} 0\n' in text
    assert 'node_scrape_collector_success{collector="uname"} 1\n' in text


def test_a_short_line_naming_a_huge_cpu_stays_small(tmp_path: Path) -> None:
    """``cpu65535`` in /proc/stat is 20 bytes; node_exporter would make 65,536 CPUs of it. Past the kernel's
    NR_CPUS (8,192) it is an error, before any family is built."""
    roots = gpunode(tmp_path)
    with open(roots.proc / "stat", "a") as f:
        f.write("cpu65535 1 2 3 4 5 6 7 8 9 10\n")
    peak, error = collect_peak(roots, "cpu")
    assert error is not None and "out of range" in str(error)
    assert peak < SLACK


def test_an_isolated_list_of_huge_ranges_stays_small(tmp_path: Path) -> None:
    """An ``isolated`` attribute of "0-65535," ranges: 320 bytes named 2.6 million CPUs (the 64 KiB an attribute
    may hold, 500 million)."""
    roots = gpunode(tmp_path)
    (roots.sys / "devices" / "system" / "cpu" / "isolated").write_text("0-65535," * 40 + "\n")
    peak, error = collect_peak(roots, "cpu")
    assert peak < 16 * MiB  # one list of 65,536 CPU numbers, not 40 of them
    assert error is not None


def test_a_family_refuses_a_huge_label_and_too_many_samples() -> None:
    from nvdaemon.collectors.bounds import LABEL_MAX
    from nvdaemon.compat.node_exporter.family import SAMPLES_MAX
    from nvdaemon.goparse import ParseError

    fam = Family("node_filesystem_size_bytes", "Filesystem size in bytes.")
    fam.add(1.0, mountpoint="/" + "a" * (LABEL_MAX - 1))
    with pytest.raises(ParseError, match="label mountpoint of 4097 characters"):
        fam.add(1.0, mountpoint="/" + "a" * LABEL_MAX)
    fam = Family("node_cpu_seconds_total", "Seconds the CPUs spent in each mode.", "counter")
    for i in range(SAMPLES_MAX):
        fam.add(0.0, cpu=str(i))
    with pytest.raises(ParseError, match=f"more than {SAMPLES_MAX} samples"):
        fam.add(0.0, cpu="x")
