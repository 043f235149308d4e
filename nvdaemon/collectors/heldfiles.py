"""Host files held open between cycles: each read again with one ``pread`` from offset 0.

procfs and sysfs render a file anew for every read from offset 0 (seq_file starts over at 0; a sysfs attribute's
``show()`` runs again), so a file kept open costs one ``pread(2)`` a cycle, where a fresh read costs ``open``,
``fstat``, ``read`` and ``close`` and the kernel's walk of the path: on the 2-CPU test machine 1.7 against 9.2 us a
sysfs attribute, 4.7 against 11.6 us over a core tick's files there, procfs ones included (``bench/held_files.py``).
A regular file on a local file system (a host root copied from a node, as the fixture hosts and the benchmarks use)
is held the same way: a ``pread`` from 0 reads what it holds now, written in place or not. What keeps a held file
right (``CycleReads`` stats each directory it reads in once per cycle, and hands its identity to ``HeldFiles.read``):

- Which file systems: procfs and sysfs (``PSEUDO``), and ``SETTLED_FILE_SYSTEMS`` (``SETTLED``), found by the file
  system of their device number in ``/proc/self/mountinfo`` (read once per device number). Not overlayfs (a lower
  file written through it is copied up: a descriptor opened before reads the old one), not network file systems
  (their change times are the server's clock).
- A pseudo file's device that goes: its files answer ENODEV. The descriptor is closed and the path opened again,
  which fails as a missing file does, or finds the device that took the name.
- A device that is renamed keeps its files (a NIC renamed, another one taking its old name): each held file is bound
  to the identity (st_dev, st_ino, symlinks followed) of its directory; a different directory there and the file is
  opened afresh.
- A regular file replaced (a rename over it, a delete and a new file) leaves its descriptor on the old one: the
  directory's change time moves with every entry added, removed or renamed in it (and cannot be set back, as a
  modification time can), so it is part of a settled directory's identity. The kernel stamps it from a coarse clock
  (a jiffy; a whole second on some file systems), so two changes in one stamp look like one: a directory changed
  within ``SETTLED_SECONDS`` of the cycle's start is not trusted, its files read afresh and not held, as git treats
  a file as "racily clean". A stamp older than that cannot recur, as any later change is stamped later. A path that
  is itself a symlink is not held (its target's directory is not the one stat'ed).
- One reader at a time: a descriptor is taken out of the table while it is read, so a read that hangs (its worker
  thread abandoned by the cycle) keeps its descriptor to itself, and the next cycle opens another.
- Bounded: at most ``MAX_HELD`` descriptors and an eighth of RLIMIT_NOFILE's soft limit (the server's connection cap
  leaves them room); one not read for ``IDLE_SECONDS`` is closed (looked for at most once a minute, as a cycle
  starts). Each costs the kernel a file and a page of seq_file buffer, charged to the pod's memory cgroup: 4.4 KiB a
  file measured (kmem of this machine's cgroup, 710 sysfs files), about 2.6 MiB for 600.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Callable
from pathlib import Path

from nvdaemon.collectors.hostfiles import PAGE, SYSFS_FILE, open_checked, read_fd

MAX_HELD = 4096
IDLE_SECONDS = 300.0  # a file not read for this long (its device gone, a collector turned off) is closed
SWEEP_SECONDS = 60.0
MAX_ELSEWHERE = 4096
SETTLED_SECONDS = 2.0  # the newest directory change time trusted, before a cycle's start (a stamp's coarseness: < 1 s)
MOUNTINFO = Path("/proc/self/mountinfo")
# A held file whose device went away (or, ESPIPE, one that cannot be read at an offset): opened afresh.
REOPEN_ERRNOS = frozenset({errno.ENODEV, errno.ENOENT, errno.ESTALE, errno.ESPIPE})

# How a file system's files are held (``device_kinds``).
NOT_HELD = 0
PSEUDO = 1
"""procfs, sysfs: a directory's identity is (st_dev, st_ino)."""
SETTLED = 2
"""A local disk or memory file system: (st_dev, st_ino, st_ctime_ns), for a directory not changed lately."""
PSEUDO_FILE_SYSTEMS = frozenset({"proc", "sysfs"})
SETTLED_FILE_SYSTEMS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "f2fs"})

DirIdentity = tuple[int, ...]


def held_cap() -> int:
    """How many descriptors ``HeldFiles`` may keep: ``MAX_HELD``, at most an eighth of the soft RLIMIT_NOFILE (which
    ``nvdaemon run`` raises to the hard limit first, as Go does)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_HELD if soft == resource.RLIM_INFINITY else max(0, min(MAX_HELD, soft // 8))


def device_kinds(mountinfo: str) -> dict[int, int]:
    """How the files of each device number in ``mountinfo`` (``/proc/self/mountinfo``'s text: ``36 35 0:21 / /sys
    rw,nosuid shared:7 - sysfs sysfs rw``, the third field the device, the one after ``-`` the file system type) are
    held: ``PSEUDO`` or ``SETTLED``; a device of another file system is left out. A line out of shape is passed over:
    its mount is then not held, only read afresh."""
    found: dict[int, int] = {}
    for line in mountinfo.splitlines():
        fields, sep, tail = line.partition(" - ")
        parts = fields.split()
        fs_type = tail.split(" ", 1)[0]
        kind = PSEUDO if fs_type in PSEUDO_FILE_SYSTEMS else SETTLED if fs_type in SETTLED_FILE_SYSTEMS else NOT_HELD
        if not sep or len(parts) < 3 or kind == NOT_HELD:
            continue
        major, colon, minor = parts[2].partition(":")
        if colon and major.isdigit() and minor.isdigit():
            found[os.makedev(int(major), int(minor))] = kind
    return found


def directory_identity(st: os.stat_result, kind: int, settled_before_ns: int) -> DirIdentity | None:
    """What a held file of a directory (``st``, on a file system held as ``kind``) is bound to; None where its files
    are read afresh this cycle (a settled directory changed at or after ``settled_before_ns``, wall clock)."""
    if kind == PSEUDO:
        return (st.st_dev, st.st_ino)
    if kind == SETTLED and st.st_ctime_ns < settled_before_ns:
        return (st.st_dev, st.st_ino, st.st_ctime_ns)
    return None


class _Held:
    __slots__ = ("directory", "fd", "used")

    def __init__(self, fd: int, directory: DirIdentity, used: float) -> None:
        self.fd = fd
        self.directory = directory
        self.used = used


class HeldFiles:
    """The host files kept open between cycles, by path (one table for the process: every tier shares it)."""

    def __init__(self, mountinfo: Path = MOUNTINFO, cap: Callable[[], int] = held_cap) -> None:
        self._mountinfo = mountinfo
        self._cap = cap
        self._table: dict[str, _Held] = {}
        self._kinds: dict[int, int] = {}  # st_dev -> PSEUDO, SETTLED or NOT_HELD
        self._elsewhere: set[str] = set()  # directories whose files are never held (mark_elsewhere)
        self._now = 0.0  # the start of the latest cycle: when a put-back file was last read, near enough
        self._max: int | None = None  # cap(), asked again at each sweep (a syscall: not once per file)
        self._next_sweep = 0.0
        self.opened = 0  # descriptors opened and then held, since the start (a test's and a bench's measure)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, path: str) -> bool:
        """Whether ``path`` is held now (not being read)."""
        return path in self._table

    def read(self, path: str, directory: DirIdentity, limit: int, kind: int) -> bytes:
        """``read_bounded(path, limit, kind)`` of a file whose directory is ``directory`` now
        (``directory_identity``), through the descriptor held since an earlier cycle when there is one and it is
        still this file's."""
        held = self._table.pop(path, None)
        if held is not None:
            if held.directory == directory:
                try:
                    if kind == SYSFS_FILE and limit >= PAGE:
                        # One pread of a page, no call into read_fd: an attribute shorter than a page is whole
                        # (1.7 against 2.4 us a held attribute, bench/held_files.py).
                        data = os.pread(held.fd, PAGE, 0)
                        if len(data) >= PAGE:
                            data = read_fd(held.fd, path, limit, kind, 0, held=True)
                    else:
                        data = read_fd(held.fd, path, limit, kind, 0, held=True)
                except OSError as exc:
                    if exc.errno not in REOPEN_ERRNOS:
                        self._put_back(path, held)  # the driver's own error: a new descriptor would get it too
                        raise
                else:
                    self._put_back(path, held)
                    return data
            os.close(held.fd)  # gone, replaced, or another device's directory now: open the path afresh
        fd, st = open_checked(path, kind)
        try:
            data = read_fd(fd, path, limit, kind, st.st_size)
        except BaseException:
            os.close(fd)
            raise
        if not self._holdable(path, st):
            os.close(fd)
        elif self._put_back(path, _Held(fd, directory, self._now), new=True):
            self.opened += 1
        return data

    def _holdable(self, path: str, st: os.stat_result) -> bool:
        """Whether the file just opened at ``path`` (its fstat ``st``) may be kept: on a held file system and, on a
        settled one, named by ``path`` itself, not through a symlink."""
        kind = self.device_kind(st.st_dev)
        if kind != SETTLED:
            return kind == PSEUDO
        try:
            named = os.lstat(path)
        except OSError:
            return False
        return named.st_ino == st.st_ino and named.st_dev == st.st_dev

    def elsewhere(self, directory: str) -> bool:
        """Whether ``directory`` was found on a file system whose files are never held."""
        return directory in self._elsewhere

    def mark_elsewhere(self, directory: str) -> None:
        """Remember that ``directory``'s files are never held, so a cycle need not stat it again. Safe to keep: a
        file not held is only read the longer way. Bounded: the set is emptied at ``MAX_ELSEWHERE`` entries."""
        if len(self._elsewhere) >= MAX_ELSEWHERE:
            self._elsewhere.clear()
        self._elsewhere.add(directory)

    def device_kind(self, device: int) -> int:
        """How files of ``device`` are held: ``PSEUDO``, ``SETTLED`` or ``NOT_HELD`` (by ``/proc/self/mountinfo``)."""
        known = self._kinds.get(device)
        if known is None:
            try:
                known = device_kinds(self._mountinfo.read_text(errors="replace")).get(device, NOT_HELD)
            except OSError:
                known = NOT_HELD
            self._kinds[device] = known
        return known

    def _put_back(self, path: str, held: _Held, new: bool = False) -> bool:
        """Keep ``held`` for the next cycle, or close it (False) when another reader put its own back first or, for
        a ``new`` one, the table is full. No lock: ``dict.setdefault`` and ``pop`` are single steps under the GIL
        (a lock here cost a tenth of a held read); readers racing past the bound exceed it by one each at most."""
        held.used = self._now
        if new:
            if self._max is None:
                self._max = self._cap()
            if len(self._table) >= self._max:
                os.close(held.fd)
                return False
        if self._table.setdefault(path, held) is held:
            return True
        os.close(held.fd)
        return False

    def sweep(self, now: float) -> None:
        """Mark a cycle's start at ``now`` (monotonic seconds); at most every ``SWEEP_SECONDS``, close the files not
        read for ``IDLE_SECONDS``."""
        self._now = now
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_SECONDS
        self._max = self._cap()
        for path, held in list(self._table.items()):  # a copy made in one step: readers may pop and put meanwhile
            if now - held.used > IDLE_SECONDS:
                self._close(path, held)

    def close(self) -> None:
        """Close every held file (one being read is put back by its reader)."""
        for path, held in list(self._table.items()):
            self._close(path, held)

    def _close(self, path: str, held: _Held) -> None:
        """Close ``held`` if it is still ``path``'s entry (a reader may have taken it meanwhile: then it is theirs)."""
        taken = self._table.pop(path, None)
        if taken is held:
            os.close(held.fd)
        elif taken is not None:  # another reader's, put back between the copy and this pop: keep it
            self._put_back(path, taken)


HELD = HeldFiles()
