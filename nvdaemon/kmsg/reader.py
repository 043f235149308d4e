"""Reading ``/dev/kmsg`` (``<devRoot>/kmsg``) as records, without blocking the event loop.

The character device: opened ``O_RDONLY | O_NONBLOCK``; each ``read()`` returns one record, from the oldest the
ring buffer still holds; ``EAGAIN`` means none is left (``wait_readable`` then waits for the next: the device
supports poll); ``EPIPE`` means records were overwritten before we read them: counted, and the next read goes on
from the oldest left (the gap shows in the seqs and is counted as records lost). A read into a buffer smaller than
the record fails with ``EINVAL`` and the kernel skips that record, so the buffer is larger than any record
(``READ_BYTES``; records are at most 2 KiB of formatted text, 8 KiB on older kernels).

A regular file (a fixture host's ``dev/kmsg``, records back to back as the device gives them) is read line by line
from where the last read stopped, an unfinished last line left for the next read; continuation lines are skipped.
It is checked for new lines every ``FILE_POLL_SECONDS``.

Every read is a memory copy in the kernel (no disk, no device that can hang), so reads run on the loop.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import trio

READ_BYTES = 16384
FILE_CHUNK_BYTES = 1 << 20  # bytes of a fixture file read at once
FILE_POLL_SECONDS = 0.5


class KmsgReader:
    """One open ``/dev/kmsg`` (or fixture file). ``OSError`` from ``open``: FileNotFoundError (not on this node),
    PermissionError (no CAP_SYSLOG under dmesg_restrict, or a device cgroup that refuses it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1
        self.device = False
        self.overruns = 0  # EPIPE answers
        self._offset = 0
        self._pending = b""

    def open(self) -> None:
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            os.close(fd)
            raise
        if not (stat.S_ISCHR(mode) or stat.S_ISREG(mode)):  # a directory or socket at the path: not a log
            os.close(fd)
            raise OSError(errno.EINVAL, "not a character device or a file")
        self.fd, self.device = fd, stat.S_ISCHR(mode)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def records(self, limit: int) -> Iterator[bytes]:
        """Up to ``limit`` records available now (none: nothing new)."""
        if self.device:
            yield from self._device_records(limit)
        else:
            yield from self._file_records(limit)

    def _device_records(self, limit: int) -> Iterator[bytes]:
        for _ in range(limit):
            try:
                raw = os.read(self.fd, READ_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.overruns += 1
                    continue
                if exc.errno == errno.EINVAL:  # a record larger than the buffer: the kernel skipped it
                    continue
                raise
            if not raw:
                return
            yield raw

    def _file_records(self, limit: int) -> Iterator[bytes]:
        n = 0
        buf, pos = self._pending, 0
        try:
            while n < limit:
                end = buf.find(b"\n", pos)
                if end < 0:  # the rest is an unfinished line: read on after it
                    buf, pos = buf[pos:], 0
                    if len(buf) > FILE_CHUNK_BYTES:  # no newline in a whole chunk: not a log of records
                        buf = b""
                    chunk = os.pread(self.fd, FILE_CHUNK_BYTES, self._offset)
                    if not chunk:
                        break
                    self._offset += len(chunk)
                    buf += chunk
                    continue
                line = buf[pos : end + 1]
                pos = end + 1
                if len(line) > 1 and line[0] != 0x20:  # continuation lines (" KEY=value") are not records
                    n += 1
                    yield line
        finally:  # also when the reader of the records stops early: what was yielded is not read again
            self._pending = buf[pos:]

    async def wait(self) -> None:
        """Until a record may be there to read."""
        if self.device:
            await trio.lowlevel.wait_readable(self.fd)
        else:
            await trio.sleep(FILE_POLL_SECONDS)
