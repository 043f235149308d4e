"""Host files held open between cycles (``collectors/heldfiles.py``): a procfs or sysfs file read in one cycle is
read in the next with one pread from offset 0, and must then hold what a fresh read would. On this machine's own
/proc and /sys (values that move must be seen moving), and with faults put in the way: a device gone (ENODEV), a
directory that is another device's now (a rename), a driver's error, a read that hangs, a full table, idle files.
A regular file of a host root on a local file system is held once its directory has settled, and every way of
changing it is seen: written in place, replaced by a rename, deleted; a directory changed lately, a symlinked file
and a file system that is neither are read afresh.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nvdaemon.collectors import base, heldfiles
from nvdaemon.collectors.base import CYCLE_READS, PROCFS_FILE, CycleReads, NotPresent, read_attr, read_text
from nvdaemon.collectors.heldfiles import (
    IDLE_SECONDS,
    MAX_ELSEWHERE,
    PSEUDO,
    SETTLED,
    SETTLED_SECONDS,
    SWEEP_SECONDS,
    HeldFiles,
    device_kinds,
)
from tests.polling import until_sync

LO = Path("/sys/class/net/lo")
TX_BYTES = str(LO / "statistics" / "tx_bytes")
MTU = str(LO / "mtu")
UPTIME = "/proc/uptime"

T = TypeVar("T")
needs_lo = pytest.mark.skipif(not LO.is_dir(), reason="no loopback interface in /sys/class/net on this machine")


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldFiles]:
    """A table of its own for the test (the process's one is shared by every cycle), closed at the end."""
    table = HeldFiles()
    monkeypatch.setattr(base, "HELD", table)
    yield table
    table.close()


class Opens:
    """The paths ``os.open`` was given, and the descriptors ``os.close`` closed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        self.closed: list[int] = []
        real_open, real_close = os.open, os.close

        def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
            self.paths.append(os.fspath(path))
            return real_open(path, *args, **kwargs)

        def counting_close(fd: int) -> None:
            self.closed.append(fd)
            real_close(fd)

        monkeypatch.setattr(os, "open", counting_open)
        monkeypatch.setattr(os, "close", counting_close)


def in_cycle(read: Callable[[], T]) -> T:
    """``read()`` within a cycle of its own (a tier's tick)."""
    token = CYCLE_READS.set(CycleReads())
    try:
        return read()
    finally:
        CYCLE_READS.reset(token)


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@needs_lo
def test_a_held_sysfs_attribute_is_read_anew_by_one_pread(held: HeldFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    before = int(in_cycle(lambda: read_attr(TX_BYTES)))
    assert len(held) == 1 and held.opened == 1
    opens = Opens(monkeypatch)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.closing(sender):
        for _ in range(50):
            sender.sendto(b"x" * 1000, ("127.0.0.1", 9))  # loopback counts them sent, listener or not
    after = int(in_cycle(lambda: read_attr(TX_BYTES)))
    assert after >= before + 50 * 1000, "the held descriptor gave the old value: the attribute was not rendered anew"
    assert after <= int(Path(TX_BYTES).read_text())
    assert opens.paths == [] and held.opened == 1  # no second open of the attribute


def test_a_held_procfs_file_is_read_anew(held: HeldFiles) -> None:
    first = in_cycle(lambda: read_text(UPTIME, kind=PROCFS_FILE))
    assert len(held) == 1
    later = until_sync(
        lambda: (t := in_cycle(lambda: read_text(UPTIME, kind=PROCFS_FILE))) != first and t,
        "/proc/uptime moving through the held descriptor",
        timeout=30,
    )
    assert float(later.split()[0]) > float(first.split()[0])
    assert held.opened == 1


@needs_lo
def test_a_directory_that_is_another_device_now_opens_the_file_afresh(
    held: HeldFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NIC renamed keeps its open files, and another may take its name: the directory's identity (one stat per
    directory and cycle) tells the held descriptor from the new device's file."""
    assert in_cycle(lambda: read_attr(MTU)) == Path(MTU).read_text()
    opens = Opens(monkeypatch)
    real_stat = os.stat

    def another_device(path: Any, *args: Any, **kwargs: Any) -> Any:
        st = real_stat(path, *args, **kwargs)
        if os.fspath(path) != str(LO):
            return st
        fields = list(st)
        fields[1] += 1_000_003  # st_ino: the name leads to another directory now
        return os.stat_result(fields)

    monkeypatch.setattr(os, "stat", another_device)
    assert in_cycle(lambda: read_attr(MTU)) == Path(MTU).read_text()
    assert opens.paths == [MTU] and len(opens.closed) == 1  # the old descriptor closed, the path opened again
    assert held.opened == 2 and len(held) == 1


@needs_lo
def test_a_device_gone_is_opened_again_by_path(held: HeldFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    in_cycle(lambda: read_attr(MTU))
    real_pread = os.pread
    calls: list[int] = []

    def gone_once(fd: int, n: int, offset: int) -> bytes:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", gone_once)
    assert in_cycle(lambda: read_attr(MTU)) == Path(MTU).read_text()
    assert held.opened == 2 and len(held) == 1


@needs_lo
def test_a_drivers_error_is_raised_and_the_descriptor_kept(held: HeldFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    in_cycle(lambda: read_attr(MTU))

    def failing(fd: int, n: int, offset: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as m:
        m.setattr(os, "pread", failing)
        with pytest.raises(OSError) as raised:
            in_cycle(lambda: read_attr(MTU))
    assert raised.value.errno == errno.EIO
    assert in_cycle(lambda: read_attr(MTU)) == Path(MTU).read_text()
    assert held.opened == 1 and len(held) == 1


ADDRESS = str(LO / "address")


def twice(path: str) -> Callable[[], list[str | BaseException]]:
    """Within one cycle: ``MTU`` (which stats the directory, so ``path`` beside it takes ``CycleReads.read``'s short
    way to its held descriptor), then ``path`` by two readers: each one's text, or what it raised."""

    def read() -> list[str | BaseException]:
        got: list[str | BaseException] = []
        read_attr(MTU)
        for _ in range(2):
            try:
                got.append(read_attr(path))
            except (OSError, NotPresent) as exc:
                got.append(exc)
        return got

    return read


@needs_lo
def test_the_short_way_to_a_held_file_keeps_the_long_ways_answers(
    held: HeldFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file whose directory the cycle has stat'ed already is read without ``_fill`` and ``_read_pseudo``: the same
    text, the same errors, each kept for the cycle's other readers, and the descriptor kept as the long way keeps
    it."""
    text = Path(ADDRESS).read_text()
    assert in_cycle(twice(ADDRESS)) == [text, text]
    assert held.opened == 2 and len(held) == 2
    fd = held._table[ADDRESS].fd
    real_pread = os.pread
    preads: list[int] = []

    def sick(at: int, n: int, offset: int) -> bytes:
        if at == fd:
            preads.append(at)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_pread(at, n, offset)

    with monkeypatch.context() as m:
        m.setattr(os, "pread", sick)
        first, second = in_cycle(twice(ADDRESS))
    assert isinstance(first, OSError) and first.errno == errno.EIO and second is first
    assert preads == [fd]  # read once: the second reader got the cycle's error
    assert held._table[ADDRESS].fd == fd  # the driver's error: the descriptor is kept

    def gone(at: int, n: int, offset: int) -> bytes:
        if at == fd:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        return real_pread(at, n, offset)

    def missing(path: str, kind: int) -> tuple[int, os.stat_result]:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)

    with monkeypatch.context() as m:
        m.setattr(os, "pread", gone)
        m.setattr(heldfiles, "open_checked", missing)  # the device went, and its path with it
        first, second = in_cycle(twice(ADDRESS))
    assert isinstance(first, NotPresent) and second is first
    assert isinstance(first.__cause__, FileNotFoundError)
    assert ADDRESS not in held  # its descriptor closed
    assert in_cycle(twice(ADDRESS)) == [text, text]


class Interrupted(BaseException):
    """What a read may be interrupted by that is no ``Exception`` (KeyboardInterrupt, a cancellation)."""


@needs_lo
def test_a_read_interrupted_on_the_short_way_leaves_no_reader_waiting(
    held: HeldFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_cycle(twice(ADDRESS))  # both files held
    fd = held._table[ADDRESS].fd
    real_pread = os.pread

    def interrupted(at: int, n: int, offset: int) -> bytes:
        if at == fd:
            raise Interrupted
        return real_pread(at, n, offset)

    cycle = CycleReads()
    token = CYCLE_READS.set(cycle)
    try:
        read_attr(MTU)  # stats the directory: ADDRESS takes the short way
        with monkeypatch.context() as m:
            m.setattr(os, "pread", interrupted)
            with pytest.raises(Interrupted):
                read_attr(ADDRESS)
    finally:
        CYCLE_READS.reset(token)
    other: list[object] = []
    reader = threading.Thread(target=lambda: other.append(cycle.read(ADDRESS, 64 * 1024, base.SYSFS_FILE)), daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "the cycle's next reader waits for an entry nobody will fill"


def stamped_after(directory: Path) -> None:
    """Wait until the kernel's file time stamps (a coarse clock: a jiffy) have moved past ``directory``'s change time,
    so the test's next change to it is stamped later, as a change two seconds later always is."""
    settled = directory.stat().st_ctime_ns
    scratch = directory.parent / f"{directory.name}.stamp"

    def moved() -> bool:
        scratch.write_text("x")  # a new inode each time: stamped now
        moved_on = os.stat(scratch).st_ctime_ns > settled
        scratch.unlink()
        return moved_on

    until_sync(moved, f"the file time stamps to move past {directory}'s", timeout=30, step=0.002)


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cycles that start ten seconds from now, wall clock: a directory the test made is settled by then."""
    real = base.wall_clock_ns
    monkeypatch.setattr(base, "wall_clock_ns", lambda: real() + 10 * 1_000_000_000)


def attribute(root: Path, text: str) -> Path:
    attr = root / "sys" / "class" / "net" / "eth0" / "mtu"
    attr.parent.mkdir(parents=True)
    attr.write_text(text)
    return attr


def on_local_disk(path: Path) -> bool:
    return HeldFiles().device_kind(path.stat().st_dev) == SETTLED


needs_local_tmp = pytest.mark.skipif(
    not on_local_disk(Path(tempfile.gettempdir())),
    reason="the temporary directory is not on a local disk",
)


@needs_local_tmp
@pytest.mark.usefixtures("later")
def test_a_regular_file_in_a_settled_directory_is_held_and_every_change_is_seen(
    held: HeldFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attr = attribute(tmp_path, "1500\n")
    assert in_cycle(lambda: read_attr(str(attr))) == "1500\n"
    assert str(attr) in held and held.opened == 1
    opens = Opens(monkeypatch)
    attr.write_text("1450\n")  # written in place: the held descriptor's file
    assert in_cycle(lambda: read_attr(str(attr))) == "1450\n"
    assert opens.paths == [] and held.opened == 1
    stamped_after(attr.parent)
    replacement = attr.with_name("mtu.new")
    replacement.write_text("9000\n")
    replacement.replace(attr)  # another file by that name now: the directory changed
    assert in_cycle(lambda: read_attr(str(attr))) == "9000\n"
    assert opens.paths == [str(attr)] and len(opens.closed) == 1  # the old descriptor closed, the path opened again
    stamped_after(attr.parent)
    attr.unlink()
    with pytest.raises(NotPresent):
        in_cycle(lambda: read_attr(str(attr)))
    assert len(held) == 0


@needs_local_tmp
def test_a_directory_changed_lately_is_read_afresh(
    held: HeldFiles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two changes within one time stamp look like none: a directory changed within ``SETTLED_SECONDS`` of the cycle's
    start is not trusted, and its files are neither read through nor kept as held descriptors."""
    attr = attribute(tmp_path, "1500\n")
    # Each cycle starts SETTLED_SECONDS / 2 after the directory's latest change: within the window, whatever the
    # machine's load.
    half = int(SETTLED_SECONDS / 2 * 1e9)
    monkeypatch.setattr(base, "wall_clock_ns", lambda: attr.parent.stat().st_ctime_ns + half)
    for text in ("1500\n", "9000\n"):
        replacement = attr.with_name("mtu.new")
        replacement.write_text(text)
        replacement.replace(attr)
        assert in_cycle(lambda: read_attr(str(attr))) == text
    assert len(held) == 0 and held.opened == 0
    assert not held.elsewhere(str(attr.parent))  # its file system is held: it is stat'ed again next cycle


@needs_local_tmp
@pytest.mark.usefixtures("later")
def test_a_symlinked_file_is_not_held(held: HeldFiles, tmp_path: Path) -> None:
    """A path that is a symlink reads a file in another directory, whose changes the stat of this one does not see."""
    target = tmp_path / "elsewhere" / "mtu"
    target.parent.mkdir()
    target.write_text("1500\n")
    attr = tmp_path / "sys" / "mtu"
    attr.parent.mkdir()
    attr.symlink_to(target)
    assert in_cycle(lambda: read_attr(str(attr))) == "1500\n"
    assert len(held) == 0 and held.opened == 0


def test_a_file_on_a_file_system_not_held_is_opened_every_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host root on overlayfs or NFS (a mountinfo naming neither a pseudo nor a settled file system for it)."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"28 1 {os.major(tmp_path.stat().st_dev)}:{os.minor(tmp_path.stat().st_dev)} / / rw - nfs4 srv:/ rw\n"
    )
    table = HeldFiles(mountinfo=mountinfo)
    monkeypatch.setattr(base, "HELD", table)
    attr = attribute(tmp_path, "1500\n")
    assert in_cycle(lambda: read_attr(str(attr))) == "1500\n"
    assert len(table) == 0 and table.opened == 0
    assert table.elsewhere(str(attr.parent))  # known after one stat: later cycles go straight to a plain read


def test_directories_known_elsewhere_are_bounded() -> None:
    table = HeldFiles()
    for i in range(MAX_ELSEWHERE + 10):
        table.mark_elsewhere(f"/fixture/sys/class/net/eth{i}")
    assert len(table._elsewhere) <= MAX_ELSEWHERE
    assert table.elsewhere(f"/fixture/sys/class/net/eth{MAX_ELSEWHERE + 9}")


def test_a_missing_file_is_not_present(held: HeldFiles) -> None:
    with pytest.raises(NotPresent):
        in_cycle(lambda: read_attr("/sys/class/net/lo/no-such-attribute"))
    with pytest.raises(NotPresent):
        in_cycle(lambda: read_attr("/sys/class/net/no-such-nic-here/mtu"))
    assert len(held) == 0


@needs_lo
def test_a_read_that_hangs_keeps_its_descriptor_and_the_next_cycle_opens_another(
    held: HeldFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_cycle(lambda: read_attr(MTU))
    fds_before = open_fds()
    release, hung = threading.Event(), threading.Event()
    real_pread = os.pread
    hanging = threading.current_thread()

    def pread(fd: int, n: int, offset: int) -> bytes:
        if threading.current_thread() is not hanging and not release.is_set():
            hung.set()
            assert release.wait(30)
        return real_pread(fd, n, offset)

    monkeypatch.setattr(os, "pread", pread)
    results: list[str] = []
    stuck = threading.Thread(target=lambda: results.append(in_cycle(lambda: read_attr(MTU))))
    stuck.start()
    assert hung.wait(30)
    # The abandoned read has the held descriptor: this cycle opens the path again, and is not blocked behind it.
    assert in_cycle(lambda: read_attr(MTU)) == Path(MTU).read_text()
    assert held.opened == 2
    release.set()
    stuck.join(30)
    assert results == [Path(MTU).read_text()]
    assert len(held) == 1 and len(open_fds()) == len(fds_before)  # one of the two put back, the other closed


def test_the_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    table = HeldFiles(cap=lambda: 2)
    monkeypatch.setattr(base, "HELD", table)
    names = ["uptime", "loadavg", "meminfo", "version", "stat"]
    try:
        for _ in range(2):
            texts = [in_cycle(functools.partial(read_text, f"/proc/{n}", kind=PROCFS_FILE)) for n in names]
            assert all(texts) and texts[3] == Path("/proc/version").read_text()  # held or not, each file whole
            assert len(table) == 2
    finally:
        table.close()


def test_files_not_read_for_a_while_are_closed(held: HeldFiles) -> None:
    in_cycle(lambda: read_text(UPTIME, kind=PROCFS_FILE))
    fds = open_fds()
    start = held._now
    held.sweep(start + SWEEP_SECONDS)
    assert len(held) == 1  # read within IDLE_SECONDS
    held.sweep(start + SWEEP_SECONDS + IDLE_SECONDS + 1)
    assert len(held) == 0 and len(open_fds()) == len(fds) - 1


def test_held_files_are_procfs_sysfs_and_local_file_systems() -> None:
    mountinfo = "\n".join(
        [
            "22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw",
            "23 28 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw",
            "28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw",
            "30 22 0:6 / /sys/kernel/security rw shared:8 - securityfs securityfs rw",
            "41 28 0:40 / /host/proc rw - proc proc rw",
            "42 28 0:41 / /tmp rw - tmpfs tmpfs rw",
            "43 28 0:42 / /var/lib/docker/overlay2/x/merged rw - overlay overlay rw,lowerdir=/a,upperdir=/b",
            "44 28 0:43 / /mnt/nfs rw - nfs4 server:/export rw",
            "garbage without the separator 0:99 - sysfs",
            "1 2 x:y / /odd rw - sysfs sysfs rw",
            "",
        ]
    )
    assert device_kinds(mountinfo) == {
        os.makedev(0, 21): PSEUDO,
        os.makedev(0, 22): PSEUDO,
        os.makedev(0, 40): PSEUDO,
        os.makedev(259, 2): SETTLED,
        os.makedev(0, 41): SETTLED,
    }
    assert device_kinds(Path("/proc/self/mountinfo").read_text()).get(os.stat("/proc/uptime").st_dev) == PSEUDO


def test_an_unreadable_mountinfo_holds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = HeldFiles(mountinfo=tmp_path / "absent")
    monkeypatch.setattr(base, "HELD", table)
    assert in_cycle(lambda: read_text(UPTIME, kind=PROCFS_FILE))
    assert len(table) == 0 and table.opened == 0
