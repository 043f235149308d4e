"""Every host file read has a cap that fits its kind; an oversized file, a sensor linked to /dev/zero or a FIFO is a
counted error of the collector reading it (``success`` false, ``error_total`` up), never a read of the whole file,
and the other collectors of the cycle still succeed.

The poisoned files are those of the probes: a 12 MB one-line /proc/loadavg, a 100 MB (sparse) meminfo and a hwmon
``temp3_input`` symlinked to /dev/zero. That memory stays bounded is shown by counting the bytes read, not by RSS.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import msgspec
import pytest
import trio

from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import (
    PROC_FILE_MAX,
    PROC_TABLE_MAX,
    SYSFS_ATTR_MAX,
    FileTooLarge,
    HostRoots,
    NotRegularFile,
    read_bounded,
)
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import render
from nvdaemon.compat.node_exporter.surface import NodeExporterCollector, surface_families
from nvdaemon.config import NodeExporterConfig
from nvdaemon.model import TierSnapshot
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.collectors.conftest import copy_host


@pytest.fixture
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every chunk ``read_bounded`` gets from the kernel."""
    sizes: list[int] = []
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        chunk = real_read(fd, n)
        sizes.append(len(chunk))
        return chunk

    monkeypatch.setattr(os, "read", read)  # read_bounded calls os.read through the module
    return sizes


def poison(roots: HostRoots) -> None:
    (roots.proc / "loadavg").write_bytes(b"1" * 12_000_000)  # one line, 12 MB
    with open(roots.proc / "meminfo", "r+b") as f:
        f.truncate(100_000_000)  # sparse: the test costs no disk
    temp = roots.sys / "class" / "hwmon" / "hwmon0" / "temp3_input"
    temp.unlink()
    temp.symlink_to("/dev/zero")


async def cycle(roots: HostRoots, node_exporter: list[str] | None = None) -> TierSnapshot:
    options = msgspec.convert({"enabled": True}, NodeExporterConfig)
    collectors = collectors_for_tier("core")
    for name in node_exporter or []:
        ne = NodeExporterCollector(name, TABLE[name]())
        ne.options = options
        collectors.append(ne)
    runners = [CollectorRunner(c, trio.CapacityLimiter(1)) for c in collectors]
    return await collect_tier("core", runners, roots, 30.0)


async def test_poisoned_files_are_counted_errors_and_the_rest_succeeds(
    tmp_path: Path, counted_reads: list[int]
) -> None:
    roots = copy_host(tmp_path, "faulty")
    poison(roots)
    snap = await cycle(roots, ["loadavg", "meminfo", "netdev"])
    status = snap.collectors
    for name in ("loadavg", "memory", "node_exporter.loadavg", "node_exporter.meminfo"):
        assert not status[name].success and status[name].error_total == 1, name
    assert f"larger than {PROC_FILE_MAX} bytes, not read" in status["loadavg"].errors[0]
    assert f"larger than {PROC_FILE_MAX} bytes, not read" in status["memory"].errors[0]
    hwmon = status["hwmon"]
    assert not hwmon.success and hwmon.error_total == 1
    assert hwmon.errors == (
        f"{roots.sys}/class/hwmon/hwmon0/temp3_input: not a regular file (a character device), not read",
    )
    assert any(s.metric == "temp_celsius" for s in snap.samples)  # the chip's other sensors are still read
    others = ("cpu", "netdev", "diskstats", "pressure", "rapl", "pcie_aer", "node_exporter.netdev")
    assert {n: status[n].errors for n in others} == {n: () for n in others}
    assert all(status[n].success for n in others)
    metrics = {s.metric for s in snap.samples}
    assert "load1" not in metrics and "mem_total_bytes" not in metrics
    assert {"net_rx_bytes_total", "disk_read_bytes_total", "temp_celsius"} <= metrics
    # Each file was read once for both surfaces, and never past its cap: 2 x (4 MiB + 1) and small files.
    assert sum(counted_reads) <= 2 * (PROC_FILE_MAX + 1) + 8 * 1024 * 1024


def test_read_stops_one_byte_past_the_cap(tmp_path: Path, counted_reads: list[int]) -> None:
    sparse = tmp_path / "meminfo"
    with open(sparse, "wb") as f:
        f.truncate(100_000_000)
    with pytest.raises(FileTooLarge) as info:
        read_bounded(sparse, PROC_FILE_MAX)
    assert sum(counted_reads) == PROC_FILE_MAX + 1
    assert info.value.filename == str(sparse)
    at_cap = tmp_path / "at-cap"
    at_cap.write_bytes(b"x" * SYSFS_ATTR_MAX)
    assert len(read_bounded(at_cap, SYSFS_ATTR_MAX)) == SYSFS_ATTR_MAX


def test_devices_and_fifos_are_refused_without_reading(tmp_path: Path, counted_reads: list[int]) -> None:
    link = tmp_path / "temp3_input"
    link.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    results: dict[str, BaseException] = {}

    def attempt() -> None:
        for path in (link, fifo):
            try:
                read_bounded(path, SYSFS_ATTR_MAX)
            except OSError as exc:
                results[path.name] = exc

    worker = threading.Thread(target=attempt, daemon=True)  # a FIFO opened without O_NONBLOCK would hang here
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert isinstance(results["temp3_input"], NotRegularFile)
    assert isinstance(results["fifo"], NotRegularFile) and "a FIFO" in str(results["fifo"])
    assert counted_reads == []


def test_caps_by_kind_of_file(tmp_path: Path) -> None:
    roots = HostRoots.under(tmp_path)
    ctx = NodeContext(roots, NodeExporterConfig())
    assert ctx.read_limit(roots.sys / "class" / "hwmon" / "hwmon0" / "temp1_input") == SYSFS_ATTR_MAX
    assert ctx.read_limit(roots.proc / "loadavg") == PROC_FILE_MAX
    assert ctx.read_limit(roots.proc / "sys" / "fs" / "file-nr") == PROC_FILE_MAX
    for table in (("net", "dev"), ("net", "snmp6"), ("1", "mounts"), ("self", "mountinfo"), ("diskstats",)):
        assert ctx.read_limit(roots.proc.joinpath(*table)) == PROC_TABLE_MAX, table
    assert ctx.read_limit(roots.rootfs / "run" / "udev" / "data" / "b8:0") == PROC_FILE_MAX


async def test_oversized_textfile_is_skipped_and_counted(tmp_path: Path) -> None:
    roots = copy_host(tmp_path, "healthy")
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    (textfiles / "ok.prom").write_text("# TYPE site_ok gauge\nsite_ok 1\n")
    (textfiles / "big.prom").write_bytes(b"site_big 1\n" * 200)  # 2,200 bytes
    os.mkfifo(textfiles / "pipe.prom")
    options = msgspec.convert(
        {"enabled": True, "textfileDirectory": str(textfiles), "textfileMaxBytes": 2048}, NodeExporterConfig
    )
    ne = NodeExporterCollector("textfile", TABLE["textfile"]())
    ne.options = options
    runner = CollectorRunner(ne, trio.CapacityLimiter(1))
    with trio.fail_after(30):
        snap = await collect_tier("core", [runner], roots, 30.0)
    status = snap.collectors["node_exporter.textfile"]
    assert not status.success and status.error_total == 2
    assert status.errors == (
        f"textfile {textfiles}/big.prom: larger than 2048 bytes, not read",
        f"textfile {textfiles}/pipe.prom: not a regular file (a FIFO), not read",
    )
    families = surface_families(snap)
    assert families["site_ok"].samples  # the good file is still served
    assert "site_big" not in families
    assert families["node_textfile_scrape_error"].samples[0][1] == 1.0
    # node_exporter's own view: its textfile collector never fails
    assert 'node_scrape_collector_success{collector="textfile"} 1\n' in render(families).decode()


def test_devices_are_refused_without_opening_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a device can act by itself (a watchdog arms, a tape rewinds on close): a sensor path linked to one is
    refused on its stat, before any open."""
    link = tmp_path / "temp3_input"
    link.symlink_to("/dev/null")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    regular = tmp_path / "temp1_input"
    regular.write_text("42000\n")
    opened: list[str] = []
    real_open = os.open

    def recording_open(path: str | os.PathLike[str], flags: int, *args: int, **kwargs: int) -> int:
        opened.append(os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", recording_open)
    for path in (link, fifo):
        with pytest.raises(NotRegularFile):
            read_bounded(path, SYSFS_ATTR_MAX)
    assert opened == []
    assert read_bounded(regular, SYSFS_ATTR_MAX) == b"42000\n"
    assert opened == [str(regular)]  # the recording sees the opens read_bounded makes
