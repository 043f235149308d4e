"""Huge lines under the host-file caps: a line of megabytes in /proc/loadavg, /proc/stat, /proc/meminfo and the
/proc tables is a counted, logged error of each collector reading it, and parsing it costs no more memory than the
read itself: the shape check refuses it before any parser splits it into millions of strings.

Memory is measured with tracemalloc, which counts Python allocations deterministically. The bound is the read
(the file's bytes, at most one more copy) plus a few MiB; before, splitting a 4 MB line of two-digit numbers made
1.3 million strings, about 100 MiB.
"""

from __future__ import annotations

import logging
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import PROC_FILE_MAX, Collector, HostRoots, ParseError
from nvdaemon.collectors.cpu import CpuCollector
from nvdaemon.collectors.diskstats import DiskStatsCollector
from nvdaemon.collectors.loadavg import LoadAvgCollector
from nvdaemon.collectors.memory import MemoryCollector
from nvdaemon.collectors.netdev import NetDevCollector
from nvdaemon.collectors.pressure import PressureCollector
from nvdaemon.model import TierSnapshot
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.collectors.conftest import collect, copy_host, value

MiB = 1024 * 1024
SLACK = 4 * MiB  # what parsing may add to the read: a few MiB, against a hundred before


def numbers(size: int) -> bytes:
    """``size`` bytes of "12 12 12 ...": the line that splits into the most strings per byte."""
    return (b"12 " * (size // 3 + 1))[:size]


def poison(roots: HostRoots, only: str | None = None) -> dict[str, Path]:
    """4 MB lines in the files under the 4 MiB cap, 12 MB ones in the /proc tables (16 MiB cap); ``only``: the file
    of that one collector."""
    lines = {  # collector -> (file, text before the huge line, its size, text after it)
        "loadavg": (roots.proc / "loadavg", None, 4_000_000, b"\n"),
        "cpu": (roots.proc / "stat", b"softirq ", 4_000_000, b"\n"),
        "memory": (roots.proc / "meminfo", b"Huge: ", 4_000_000, b" kB\n"),
        "pressure": (roots.proc / "pressure" / "io", b"some ", 4_000_000, b"\n"),
        "netdev": (roots.proc / "net" / "dev", b"  eth9: ", 12_000_000, b"\n"),
        "diskstats": (roots.proc / "diskstats", b"   8 0 sdz ", 12_000_000, b"\n"),
    }
    files: dict[str, Path] = {}
    for name, (path, head, size, tail) in lines.items():
        if only not in (None, name):
            continue
        kept = b"" if head is None or name == "pressure" else path.read_bytes()  # a line added to the real file
        path.write_bytes(kept + (head or b"") + numbers(size) + tail)
        files[name] = path
    return files


def peak_of(gather: Callable[[], object]) -> int:
    """Peak bytes Python allocated while ``gather`` ran (its exception, if any, is swallowed)."""
    tracemalloc.start()
    try:
        gather()
    except ParseError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


async def core_cycle(roots: HostRoots) -> TierSnapshot:
    runners = [CollectorRunner(c, trio.CapacityLimiter(1)) for c in collectors_for_tier("core")]
    return await collect_tier("core", runners, roots, 30.0)


async def test_huge_lines_are_counted_logged_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    roots = copy_host(tmp_path, "healthy")
    files = poison(roots)
    caplog.set_level(logging.WARNING, logger="nvdaemon.tiers")
    snap = await core_cycle(roots)
    for name, path in files.items():
        status = snap.collectors[name]
        assert not status.success and status.present, name  # broken, not absent
        assert status.error_total == 1, (name, status.errors)
        assert " longer than " in status.errors[0] and str(path) in status.errors[0], status.errors
        logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"collector {name}: ")]
        assert len(logged) == 1 and " longer than " in logged[0], (name, logged)
    assert "line 1 longer than 131072 bytes" in snap.collectors["loadavg"].errors[0]
    assert "longer than 1048576 bytes" in snap.collectors["cpu"].errors[0]  # /proc/stat's own cap
    for name in ("hwmon", "rapl", "pcie_aer"):  # the collectors of other files are untouched
        assert snap.collectors[name].success, snap.collectors[name].errors
    # A second cycle counts the error again, and logs nothing new: the error did not change.
    caplog.clear()
    snap = await core_cycle_again(roots, snap)
    assert not [r for r in caplog.records if " longer than " in r.getMessage()]


async def core_cycle_again(roots: HostRoots, first: TierSnapshot) -> TierSnapshot:
    runners = [CollectorRunner(c, trio.CapacityLimiter(1)) for c in collectors_for_tier("core")]
    for runner in runners:
        runner.status = first.collectors[runner.collector.name]
    snap = await collect_tier("core", runners, roots, 30.0)
    assert snap.collectors["loadavg"].error_total == 2
    return snap


@pytest.mark.parametrize(
    "collector",
    [LoadAvgCollector, CpuCollector, MemoryCollector, PressureCollector, NetDevCollector, DiskStatsCollector],
)
def test_parsing_a_huge_line_costs_no_more_than_reading_it(tmp_path: Path, collector: type[Collector]) -> None:
    roots = copy_host(tmp_path, "healthy")
    files = poison(roots, collector.name)
    size = files[collector.name].stat().st_size
    peak = peak_of(lambda: collector().gather(roots))
    assert peak < 2 * size + SLACK, f"{collector.name}: {peak / MiB:.1f} MiB for a {size / MiB:.1f} MiB file"


def test_a_real_intr_line_of_a_big_host_still_parses(tmp_path: Path) -> None:
    """A 256-CPU host with 40,000 IRQ numbers (MSI-X queues of many NICs and GPUs): an intr line of ~160 KB, past
    the 128 KiB of other files, is what /proc/stat's own line cap is for."""
    from nvdaemon.collectors.bounds import LINE_MAX

    roots = copy_host(tmp_path, "healthy")
    stat = roots.proc / "stat"
    counts = " ".join(str(i * 7919 % 100_000) for i in range(40_000))
    lines = stat.read_text().splitlines()
    text = "\n".join(f"intr 987654321 {counts}" if line.startswith("intr ") else line for line in lines) + "\n"
    stat.write_text(text)
    assert max(map(len, text.splitlines())) > LINE_MAX
    gathered, samples = collect(CpuCollector(), roots)
    assert gathered.errors == []
    assert value(samples, "cpu_interrupts_total", "cpu") == 987654321


def test_too_many_lines_is_an_error_not_a_long_parse(tmp_path: Path) -> None:
    from nvdaemon.collectors.bounds import LINES_MAX

    roots = copy_host(tmp_path, "healthy")
    meminfo = roots.proc / "meminfo"
    meminfo.write_text("".join(f"K{i}: 1 kB\n" for i in range(LINES_MAX + 1)))
    with pytest.raises(ParseError, match=f"more than {LINES_MAX} lines, not parsed"):
        MemoryCollector().gather(roots)
    meminfo.write_text("".join(f"K{i}: 1 kB\n" for i in range(LINES_MAX)))
    gathered = MemoryCollector().gather(roots)
    assert len(gathered.data.values) == LINES_MAX


def test_what_one_file_yields_is_bounded(tmp_path: Path) -> None:
    """Per-line problems keep ERRORS_MAX lines and a count; entries (disks, interfaces, CPUs) stop at ENTRIES_MAX."""
    from nvdaemon.collectors.bounds import ENTRIES_MAX, ERRORS_MAX

    roots = copy_host(tmp_path, "healthy")
    with open(roots.proc / "net" / "dev", "a") as f:
        f.write("".join(f"  bad{i}: x\n" for i in range(3000)))
    gathered = NetDevCollector().gather(roots)
    assert len(gathered.errors) == ERRORS_MAX + 1
    assert gathered.errors[-1] == f"and {3000 - ERRORS_MAX} more"
    assert gathered.data.interfaces  # the good lines still count

    diskstats = roots.proc / "diskstats"
    zeros = " 0" * 11
    diskstats.write_text("".join(f"   8 {i % 256} sd{i}{zeros}\n" for i in range(ENTRIES_MAX + 100)))
    gathered = DiskStatsCollector().gather(roots)
    assert len(gathered.data[0]) == ENTRIES_MAX
    assert gathered.errors == [f"/proc/diskstats: more than {ENTRIES_MAX} entries, the rest not read"]

    stat = roots.proc / "stat"
    cpu_lines = "".join(f"cpu{i} 1 2 3 4 5 6 7 8 0 0\n" for i in range(ENTRIES_MAX + 10))
    stat.write_text("cpu  1 2 3 4 5 6 7 8 0 0\n" + cpu_lines + "ctxt 42\n")
    gathered, samples = collect(CpuCollector(), roots)
    assert gathered.errors == [f"/proc/stat: more than {ENTRIES_MAX} entries, the rest not read"]
    assert value(samples, "cpus_online", "cpu") == ENTRIES_MAX
    assert value(samples, "cpu_context_switches_total", "cpu") == 42  # lines after the cap are still read


def test_a_line_of_many_fields_is_refused_unsplit(tmp_path: Path) -> None:
    """A short-enough line (under LINE_MAX) of thousands of fields: a cpu line is split at most FIELDS_MAX times."""
    roots = copy_host(tmp_path, "healthy")
    stat = roots.proc / "stat"
    stat.write_text(stat.read_text().replace("cpu0 ", "cpu0 " + "1 " * 30_000, 1))
    gathered = CpuCollector().gather(roots)
    assert any("/proc/stat: cpu0: more than 64 fields" in e for e in gathered.errors), gathered.errors
    assert stat.stat().st_size < PROC_FILE_MAX


def test_healthy_hosts_are_unchanged() -> None:
    """Every fixture host still parses with no error (the full figures are the other collector tests')."""
    for host in ("healthy", "faulty"):
        roots = HostRoots.under(Path(__file__).resolve().parents[2] / "fixtures" / "hosts" / host)
        for c in (LoadAvgCollector(), CpuCollector(), MemoryCollector(), NetDevCollector(), DiskStatsCollector()):
            assert c.gather(roots).errors == [], (host, c.name)


async def test_refused_huge_lines_are_freed_at_the_end_of_each_tick(tmp_path: Path) -> None:
    """What a tick read and refused is gone when the tick ends, without the garbage collector: a kept traceback
    (the read's frames, holding the 4 MB of bytes) made each tick's refused reads live on until gc happened to run,
    and the agent's RSS climbed tick after tick (240 MiB after 30 ticks) although one tick stayed small."""
    import gc

    roots = copy_host(tmp_path, "healthy")
    poison(roots)
    await core_cycle(roots)  # warm up: imports, caches, the first tick's one-off allocations
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5):
            snap = await core_cycle(roots)
            assert not snap.collectors["loadavg"].success  # refused each time, not parsed
        del snap
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        gc.enable()
    # Five ticks each refusing about 36 MB of lines: all of it freed by reference counting alone.
    assert after - before < SLACK, f"{(after - before) / MiB:.1f} MiB still held after 5 ticks"
