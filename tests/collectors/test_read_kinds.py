"""How a host file is read depends on where it lives: a sysfs attribute or a procfs file is opened without a stat
first (those file systems hold no device nodes) and a short sysfs read is the whole attribute, while any other file
is stat'ed before it is opened, so a device there is never opened. Every kind keeps the caps and refusals. The cycle's
cache hands a file being read by one thread to another that asks for it meanwhile, read once.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nvdaemon.collectors import base
from nvdaemon.collectors.base import (
    CYCLE_READS,
    PROC_FILE_MAX,
    PROCFS_FILE,
    SYSFS_ATTR_MAX,
    SYSFS_FILE,
    CycleReads,
    FileTooLarge,
    HostRoots,
    NotPresent,
    NotRegularFile,
    read_bounded,
    read_text,
)
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.config import NodeExporterConfig
from tests.polling import until_sync


class Calls:
    """The paths given to ``os.stat`` and ``os.open``, and the size of every chunk ``os.read`` returned."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, piece: int | None = None) -> None:
        self.stats: list[str] = []
        self.opens: list[str] = []
        self.reads: list[int] = []
        real_stat, real_open, real_read = os.stat, os.open, os.read

        def stat(path: str, *args: object, **kwargs: object) -> os.stat_result:
            self.stats.append(os.fspath(path))
            return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

        def open_(path: str, flags: int, *args: int, **kwargs: int) -> int:
            self.opens.append(os.fspath(path))
            return real_open(path, flags, *args, **kwargs)

        def read(fd: int, n: int) -> bytes:
            chunk = real_read(fd, n if piece is None else min(n, piece))  # piece: a kernel answering in pieces
            self.reads.append(len(chunk))
            return chunk

        monkeypatch.setattr(os, "stat", stat)
        monkeypatch.setattr(os, "open", open_)
        monkeypatch.setattr(os, "read", read)


def test_a_short_sysfs_read_is_the_whole_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    attr = tmp_path / "temp1_input"
    attr.write_bytes(b"42000\n")
    calls = Calls(monkeypatch)
    assert read_bounded(attr, SYSFS_ATTR_MAX, SYSFS_FILE) == b"42000\n"
    assert calls.stats == [] and calls.opens == [str(attr)]
    assert calls.reads == [6]  # no second read to see the end of the file
    assert read_bounded(attr, SYSFS_ATTR_MAX) == b"42000\n"  # any other file: a stat first, then read to the end
    assert calls.stats == [str(attr)] and calls.reads == [6, 6, 0]


def test_a_sysfs_file_answering_a_page_at_a_time_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = tmp_path / "config"  # a binary attribute larger than a page comes one page per read
    data = bytes(range(256)) * 40  # 10,240 bytes
    blob.write_bytes(data)
    calls = Calls(monkeypatch, piece=4096)
    assert read_bounded(blob, SYSFS_ATTR_MAX, SYSFS_FILE) == data
    assert calls.reads == [4096, 4096, 2048, 0]


def test_a_procfs_file_answering_in_pieces_is_read_to_its_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "dev"
    data = b"".join(b"eth%d: 1 2 3 4\n" % i for i in range(100))
    table.write_bytes(data)
    calls = Calls(monkeypatch, piece=300)  # seq_file hands out what fits its buffer, short of what was asked
    assert read_bounded(table, PROC_FILE_MAX, PROCFS_FILE) == data
    assert calls.stats == [] and sum(calls.reads) == len(data) and calls.reads[-1] == 0


@pytest.mark.parametrize("kind", [SYSFS_FILE, PROCFS_FILE])
def test_pseudo_file_kinds_keep_every_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: int) -> None:
    device = tmp_path / "temp3_input"
    device.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big"
    big.write_bytes(b"1" * (SYSFS_ATTR_MAX + 10))
    calls = Calls(monkeypatch)
    results: dict[str, BaseException] = {}

    def attempt() -> None:
        for path in (device, fifo, tmp_path, big, tmp_path / "missing"):
            try:
                read_bounded(path, SYSFS_ATTR_MAX, kind)
            except OSError as exc:
                results[path.name] = exc

    worker = threading.Thread(target=attempt, daemon=True)  # opened with O_NONBLOCK: a FIFO cannot hang the open
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert isinstance(results["temp3_input"], NotRegularFile) and "a character device" in str(results["temp3_input"])
    assert isinstance(results["fifo"], NotRegularFile) and "a FIFO" in str(results["fifo"])
    assert isinstance(results[tmp_path.name], IsADirectoryError)
    assert isinstance(results["big"], FileTooLarge)
    assert isinstance(results["missing"], FileNotFoundError)
    assert calls.stats == []
    assert sum(calls.reads) == SYSFS_ATTR_MAX + 1  # only the oversized file was read, to one byte past its cap


def test_node_context_stats_first_outside_the_pseudo_file_systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    roots = HostRoots.under(tmp_path)
    attr = roots.sys / "class" / "hwmon" / "hwmon0" / "temp1_input"
    loadavg = roots.proc / "loadavg"
    for path in (attr, loadavg):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("1\n")
    devices = [
        roots.rootfs / "run" / "udev" / "data" / "c10:130",  # a root file system path: could be anything
        roots.proc / "1" / "root" / "watchdog",  # a process's root leads out of procfs
        roots.proc / "self" / "cwd" / "watchdog",
    ]
    for path in devices:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to("/dev/null")
    ctx = NodeContext(roots, NodeExporterConfig())
    calls = Calls(monkeypatch)
    assert ctx.read(attr) == "1\n" and ctx.read(str(loadavg)) == "1\n"
    assert calls.stats == [] and calls.opens == [str(attr), str(loadavg)]
    for path in devices:
        with pytest.raises(NotRegularFile):
            ctx.read(path)
    assert calls.stats == [str(p) for p in devices]
    assert calls.opens == [str(attr), str(loadavg)]  # no device opened


def read_in_threads(
    cache: CycleReads, path: str, asks: int, read: Callable[[str], str]
) -> tuple[list[threading.Thread], list[object]]:
    """``read(path)`` started in ``asks`` threads, in the cycle's context; the threads, and a list that will hold what
    each got (text or error)."""
    results: list[object] = []

    def ask() -> None:
        try:
            results.append(read(path))
        except Exception as exc:
            results.append(exc)

    token = CYCLE_READS.set(cache)
    try:
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(ask,)) for _ in range(asks)]
    finally:
        CYCLE_READS.reset(token)
    for t in threads:
        t.start()
    return threads, results


@pytest.mark.parametrize("fails", [False, True])
def test_a_file_being_read_is_waited_for_not_read_again(monkeypatch: pytest.MonkeyPatch, fails: bool) -> None:
    release = threading.Event()
    started: list[str] = []
    real_read_file = base._read_file

    def slow_read_file(path: str, limit: int, kind: int) -> str:
        started.append(path)
        assert release.wait(30)
        if fails:
            raise NotPresent(path)
        return real_read_file(path, limit, kind)

    monkeypatch.setattr(base, "_read_file", slow_read_file)
    cache = CycleReads()
    path = str(Path(__file__))
    threads, results = read_in_threads(cache, path, 3, read_text)
    until_sync(lambda: cache._waiting == 2, "the two later threads waiting for the first one's read", timeout=30)
    release.set()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    assert started == [path]  # read once, by the first thread
    assert (cache.reads, cache.shared, cache.counts().paths) == (1, 2, (path,))
    assert len(results) == 3
    if fails:
        assert all(isinstance(r, NotPresent) for r in results)
    else:
        assert results == [Path(__file__).read_text()] * 3
