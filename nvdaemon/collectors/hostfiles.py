"""Reading one host file within a cap, and the pseudo files held open between cycles.

``read_bounded`` reads a regular file of at most a cap of bytes (what every collector reads goes through it or
``HeldFiles``); ``collectors.base`` builds the cycle's shared read cache on both.

``HeldFiles``: procfs and sysfs render a file anew for every read from offset 0 (seq_file starts over at 0; a sysfs
attribute's ``show()`` runs again), so a file kept open costs one ``pread(2)`` a cycle, where a fresh read costs
``open``, ``fstat``, ``read`` and ``close`` and the kernel's walk of the path: on the 2-CPU test machine 1.7 against
9.2 us a sysfs attribute, 4.7 against 11.6 us over a core tick's files there, procfs ones included
(``bench/held_files.py``). What keeps a held file right:

- Only files of procfs and sysfs are held, found by the file system of their device number in
  ``/proc/self/mountinfo`` (read once per device number). A regular file (a fixture host, a textfile) can be
  replaced by a rename, which an open descriptor would never see.
- A device that goes: its files answer ENODEV. The descriptor is closed and the path opened again, which fails as a
  missing file does, or finds the device that took the name.
- A device that is renamed keeps its files (a NIC renamed, another one taking its old name): each held file is bound
  to the identity (st_dev, st_ino, symlinks followed) of its directory, which the cycle stats once per directory; a
  different directory there and the file is opened afresh.
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
import stat
from collections.abc import Callable
from pathlib import Path

HostPath = str | Path  # a host file, as a Path or as its string (the hot readers build strings: cheaper)

SYSFS_ATTR_MAX = 64 * 1024
PROC_FILE_MAX = 4 * 1024 * 1024
PROC_TABLE_MAX = 16 * 1024 * 1024  # /proc/1/mounts of a node with 30,000 mounts is about 6 MiB
_CHUNK = 1024 * 1024


class FileTooLarge(OSError):
    """A host file larger than the cap for its kind; it was not read whole."""

    def __init__(self, path: HostPath, limit: int) -> None:
        super().__init__(errno.EFBIG, f"larger than {limit} bytes, not read", str(path))


class NotRegularFile(OSError):
    """A host file that is a device, FIFO or socket where a regular file belongs (e.g. a link to /dev/zero)."""

    def __init__(self, path: HostPath, kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind}), not read", str(path))


def _kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a socket" if stat.S_ISSOCK(mode) else "not a file"


def _refuse_special(path: HostPath, mode: int) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, _kind(mode))


# Where a host file lives, which decides how ``read_bounded`` opens and reads it.
ANY_FILE = 0
"""Anywhere (the root file system, a textfile directory): stat'ed before it is opened, so a device is never opened."""
PROCFS_FILE = 1
"""A file of the host's procfs outside its process directories: never a device node, so it is opened without a stat
first; read to end of file, as /proc files answer in pieces (a page of records per read)."""
SYSFS_FILE = 2
"""A sysfs attribute: never a device node, so opened without a stat first; a first read shorter than a page is all of
it (the kernel renders an attribute whole, at most a page, into one read)."""
_PAGE = 4096  # a longer first read of a sysfs file may be one page of a larger binary attribute: read on to the end
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def _open_checked(path: HostPath, kind: int) -> tuple[int, os.stat_result]:
    """An open descriptor of the regular file at ``path`` and its fstat (see ``read_bounded`` for the checks)."""
    if kind == ANY_FILE:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            _refuse_special(path, mode)
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _refuse_special(path, st.st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_fd(fd: int, path: HostPath, limit: int, kind: int, size_hint: int, held: bool = False) -> bytes:
    """At most ``limit`` bytes of ``fd`` (``FileTooLarge`` beyond): from where it is, or for a ``held`` file from
    offset 0 (``pread``: its offset never moves).

    A small first read keeps the many tiny sysfs reads cheap; most files are whole after it. A sysfs attribute that
    came short of a page is known whole: no second read to see end of file."""
    want = min(limit + 1, max(8192, size_hint + 1))
    first = os.pread(fd, want, 0) if held else os.read(fd, want)
    size = len(first)
    if kind == SYSFS_FILE and size < _PAGE and size < want:
        return first
    chunks = [first]
    while first and size <= limit:
        more = min(limit + 1 - size, _CHUNK)
        chunk = os.pread(fd, more, size) if held else os.read(fd, more)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise FileTooLarge(path, limit)
    return first if len(chunks) == 1 else b"".join(chunks)


def read_bounded(path: HostPath, limit: int, kind: int = ANY_FILE) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (``FileTooLarge`` beyond; at most ``limit`` + 1 bytes
    are read). A directory raises ``IsADirectoryError``, a device, FIFO or socket ``NotRegularFile``, a missing
    file ``FileNotFoundError``. An ``ANY_FILE`` that is a device is refused before it is opened: opening one can act
    (a watchdog arms, a tape rewinds on close); the check is repeated on the open descriptor, for a path swapped in
    between and for the pseudo file systems' files (``kind``), which are not stat'ed first: sysfs and procfs hold no
    device nodes, and the stat was a third of the cost of reading an attribute (2.5 of 8.9 us)."""
    fd, st = _open_checked(path, kind)
    try:
        return _read_fd(fd, path, limit, kind, st.st_size)
    finally:
        os.close(fd)


# ---- held pseudo files ------------------------------------------------------------------------------------------
MAX_HELD = 4096
IDLE_SECONDS = 300.0  # a file not read for this long (its device gone, a collector turned off) is closed
SWEEP_SECONDS = 60.0
MAX_ELSEWHERE = 4096
PSEUDO_FILE_SYSTEMS = frozenset({"proc", "sysfs"})
MOUNTINFO = Path("/proc/self/mountinfo")
# A held file whose device went away (or, ESPIPE, one that cannot be read at an offset): opened afresh.
REOPEN_ERRNOS = frozenset({errno.ENODEV, errno.ENOENT, errno.ESTALE, errno.ESPIPE})


def held_cap() -> int:
    """How many descriptors ``HeldFiles`` may keep: ``MAX_HELD``, at most an eighth of the soft RLIMIT_NOFILE (which
    ``nvdaemon run`` raises to the hard limit first, as Go does)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_HELD if soft == resource.RLIM_INFINITY else max(0, min(MAX_HELD, soft // 8))


def pseudo_devices(mountinfo: str) -> frozenset[int]:
    """The device numbers of the procfs and sysfs mounts in ``mountinfo`` (``/proc/self/mountinfo``'s text:
    ``36 35 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw``, the third field the device, the one after ``-`` the
    file system type). A line out of shape is passed over: its mount is then not held, only read afresh."""
    found: set[int] = set()
    for line in mountinfo.splitlines():
        fields, sep, tail = line.partition(" - ")
        parts = fields.split()
        if not sep or len(parts) < 3 or tail.split(" ", 1)[0] not in PSEUDO_FILE_SYSTEMS:
            continue
        major, colon, minor = parts[2].partition(":")
        if colon and major.isdigit() and minor.isdigit():
            found.add(os.makedev(int(major), int(minor)))
    return frozenset(found)


class _Held:
    __slots__ = ("directory", "fd", "used")

    def __init__(self, fd: int, directory: tuple[int, int], used: float) -> None:
        self.fd = fd
        self.directory = directory
        self.used = used


class HeldFiles:
    """The pseudo files kept open between cycles, by path (one table for the process: every tier shares it)."""

    def __init__(self, mountinfo: Path = MOUNTINFO, cap: Callable[[], int] = held_cap) -> None:
        self._mountinfo = mountinfo
        self._cap = cap
        self._table: dict[str, _Held] = {}
        self._pseudo: dict[int, bool] = {}  # st_dev -> on procfs or sysfs
        self._elsewhere: set[str] = set()  # directories on neither (mark_elsewhere)
        self._now = 0.0  # the start of the latest cycle: when a put-back file was last read, near enough
        self._max: int | None = None  # cap(), asked again at each sweep (a syscall: not once per file)
        self._next_sweep = 0.0
        self.opened = 0  # descriptors opened and then held, since the start (a test's and a bench's measure)

    def __len__(self) -> int:
        return len(self._table)

    def __contains__(self, path: str) -> bool:
        """Whether ``path`` is held now (not being read)."""
        return path in self._table

    def read(self, path: str, directory: tuple[int, int], limit: int, kind: int) -> bytes:
        """``read_bounded(path, limit, kind)`` of a procfs or sysfs file whose directory is ``directory`` now,
        through the descriptor held since an earlier cycle when there is one and it is still this file's."""
        held = self._table.pop(path, None)
        if held is not None:
            if held.directory == directory:
                try:
                    if kind == SYSFS_FILE and limit >= _PAGE:
                        # One pread of a page, no call into _read_fd: an attribute shorter than a page is whole
                        # (1.7 against 2.4 us a held attribute, bench/held_files.py).
                        data = os.pread(held.fd, _PAGE, 0)
                        if len(data) >= _PAGE:
                            data = _read_fd(held.fd, path, limit, kind, 0, held=True)
                    else:
                        data = _read_fd(held.fd, path, limit, kind, 0, held=True)
                except OSError as exc:
                    if exc.errno not in REOPEN_ERRNOS:
                        self._put_back(path, held)  # the driver's own error: a new descriptor would get it too
                        raise
                else:
                    self._put_back(path, held)
                    return data
            os.close(held.fd)  # gone, or another device's directory now: open the path afresh
        fd, st = _open_checked(path, kind)
        try:
            data = _read_fd(fd, path, limit, kind, st.st_size)
        except BaseException:
            os.close(fd)
            raise
        if not self.holds_device(st.st_dev):
            os.close(fd)
        elif self._put_back(path, _Held(fd, directory, self._now), new=True):
            self.opened += 1
        return data

    def elsewhere(self, directory: str) -> bool:
        """Whether ``directory`` was found on neither procfs nor sysfs (its files are never held)."""
        return directory in self._elsewhere

    def mark_elsewhere(self, directory: str) -> None:
        """Remember that ``directory`` is on neither procfs nor sysfs, so a cycle need not stat it again (a fixture
        host's ~70 directories a tick). Safe to keep: a file not held is only read the longer way. Bounded: the
        set is emptied at ``MAX_ELSEWHERE`` entries."""
        if len(self._elsewhere) >= MAX_ELSEWHERE:
            self._elsewhere.clear()
        self._elsewhere.add(directory)

    def holds_device(self, device: int) -> bool:
        """Whether files of ``device`` are held: procfs or sysfs (by ``/proc/self/mountinfo``)."""
        known = self._pseudo.get(device)
        if known is None:
            try:
                known = device in pseudo_devices(self._mountinfo.read_text(errors="replace"))
            except OSError:
                known = False
            self._pseudo[device] = known
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
