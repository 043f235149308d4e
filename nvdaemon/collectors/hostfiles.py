"""Reading one host file within a cap: what every collector reads goes through ``read_bounded`` or, for the files
kept open between cycles, ``heldfiles.HeldFiles``, which shares the readers here; ``collectors.base`` builds the
cycle's shared read cache on both.
"""

from __future__ import annotations

import errno
import os
import stat
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
PAGE = 4096  # a longer first read of a sysfs file may be one page of a larger binary attribute: read on to the end
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def open_checked(path: HostPath, kind: int) -> tuple[int, os.stat_result]:
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


def read_fd(fd: int, path: HostPath, limit: int, kind: int, size_hint: int, held: bool = False) -> bytes:
    """At most ``limit`` bytes of ``fd`` (``FileTooLarge`` beyond): from where it is, or for a ``held`` file from
    offset 0 (``pread``: its offset never moves).

    A small first read keeps the many tiny sysfs reads cheap; most files are whole after it. A sysfs attribute that
    came short of a page is known whole: no second read to see end of file."""
    want = min(limit + 1, max(8192, size_hint + 1))
    first = os.pread(fd, want, 0) if held else os.read(fd, want)
    size = len(first)
    if kind == SYSFS_FILE and size < PAGE and size < want:
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
    fd, st = open_checked(path, kind)
    try:
        return read_fd(fd, path, limit, kind, st.st_size)
    finally:
        os.close(fd)
