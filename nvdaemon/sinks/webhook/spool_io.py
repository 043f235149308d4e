"""The spool for trio: one shared connection per spool file, storage failures told apart, damage moved aside.

Every endpoint of the agent uses the same ``Spool`` for ``stateDir/spool.db`` (``Spool.acquire``; released by its
last user). Every sqlite call runs in a worker thread under one ``CapacityLimiter(1)``, so the connection
(``check_same_thread=False``) is only ever used by one thread at a time; a call that has started finishes even if
its caller is cancelled.

What can go wrong with the file, and what a caller gets:

- the stateDir cannot be written (full disk, read-only filesystem or directory, permissions, an I/O error, a lock
  held too long): ``SpoolUnwritable``, with a short reason (never a path's contents or a secret). Nothing changed on
  disk; the caller keeps what it wanted to write and tries again later. The connection is opened lazily, so a
  stateDir that cannot even hold a new file is this error too, not a crash;
- the file is damaged ("file is not a database", "database disk image is malformed": a truncated file, garbage
  bytes): the connection is closed, ``spool.db`` and its ``-wal`` / ``-shm`` are moved aside as
  ``spool.db.corrupt-<time>[-n]`` (every copy kept, see ``nvdaemon.statefile``), the ids of the pending events it
  held are read from the moved copy where it can be read (else from the counts this process had; else unknown),
  the next call opens a fresh file, and the caller gets ``SpoolCorrupt`` with that record. The same record is kept
  in ``quarantines`` for the other endpoints, which count and log their own share.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Concatenate, ParamSpec, TypeVar

import trio

from nvdaemon.sinks.webhook.spool import FILE, SpoolDB, held_ids
from nvdaemon.statefile import quarantine_db

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")

# sqlite primary result codes (https://sqlite.org/rescode.html)
SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR = 3, 5, 6, 8, 10
SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_AUTH, SQLITE_NOTADB = 11, 13, 14, 23, 26
_CORRUPT = {SQLITE_CORRUPT, SQLITE_NOTADB}
_UNWRITABLE = {SQLITE_PERM, SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL, SQLITE_CANTOPEN}
_UNWRITABLE_ERRNO = {
    errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.ENOTDIR
}  # fmt: skip


class SpoolError(Exception):
    pass


class SpoolUnwritable(SpoolError):
    """The stateDir cannot take this write now; nothing was changed. Retry later."""


@dataclass
class Quarantine:
    moved: Path | None  # where the damaged spool.db went (None: only its -wal / -shm were there)
    at: float
    why: str
    held: dict[str, list[str]] | None  # pending event ids per endpoint, when the moved copy could be read
    counted: dict[str, int] = field(default_factory=dict)  # else the pending counts this process had cached


class SpoolCorrupt(SpoolError):
    """The spool file was damaged; it has been moved aside and the next call starts a fresh one."""

    def __init__(self, record: Quarantine) -> None:
        super().__init__(f"spool damaged ({record.why}); moved to {record.moved}")
        self.record = record


def classify(exc: BaseException) -> str | None:
    """``corrupt``, ``unwritable`` or None (a bug: let it propagate) for an error raised by a spool operation."""
    if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.ProgrammingError):
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        text = str(exc)
        if code in _CORRUPT or "malformed" in text or "not a database" in text:
            return "corrupt"
        if code in _UNWRITABLE or isinstance(exc, sqlite3.OperationalError):
            return "unwritable"
        return None
    if isinstance(exc, OSError) and exc.errno in _UNWRITABLE_ERRNO:
        return "unwritable"
    return None


def _full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == SQLITE_FULL or "disk is full" in str(exc)


def reason(exc: BaseException) -> str:
    """A short, operator-readable reason: the sqlite message or the OS error text (no path)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class Spool:
    """One spool file for every endpoint of this process; see the module docstring."""

    _open: ClassVar[dict[Path, Spool]] = {}

    def __init__(self, path: Path, opener: Callable[[Path], SpoolDB] = SpoolDB) -> None:
        self.path = path
        self.opener = opener  # tests pass a SpoolDB subclass that fails its writes on demand
        self.db: SpoolDB | None = None
        self.limiter = trio.CapacityLimiter(1)
        self.users = 0
        self.quarantines: list[Quarantine] = []

    @classmethod
    def acquire(cls, state_dir: Path, opener: Callable[[Path], SpoolDB] = SpoolDB) -> Spool:
        """The shared spool of ``state_dir`` (no I/O: the file is opened by the first call)."""
        path = state_dir / FILE
        spool = cls._open.get(path)
        if spool is None:
            spool = cls._open[path] = cls(path, opener)
        spool.users += 1
        return spool

    async def release(self) -> None:
        self.users -= 1
        if self.users > 0:
            return
        if Spool._open.get(self.path) is self:
            del Spool._open[self.path]
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self._close, limiter=self.limiter)

    def _close(self) -> None:
        db, self.db = self.db, None
        if db is not None:
            try:
                db.close()
            except sqlite3.Error as exc:
                log.warning("closing the spool failed: %s", reason(exc))

    async def call(self, fn: Callable[Concatenate[SpoolDB, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(db, *args)`` in a worker thread on the current connection (a fresh one after a quarantine)."""
        return await trio.to_thread.run_sync(functools.partial(self.run, fn, *args, **kwargs), limiter=self.limiter)

    def run(self, fn: Callable[Concatenate[SpoolDB, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call`` without the thread (only ever under ``limiter``, or where nothing else uses this spool)."""
        try:
            if self.db is None:
                self.db = self.opener(self.path)
            return fn(self.db, *args, **kwargs)
        except (sqlite3.Error, OSError) as exc:
            kind = classify(exc)
            if kind == "corrupt":
                try:
                    record = self._quarantine(reason(exc))
                except OSError as moving:  # a read-only stateDir: the damaged file stays, and so does the error
                    raise SpoolUnwritable(f"{reason(exc)}; cannot move it aside: {reason(moving)}") from exc
                raise SpoolCorrupt(record) from exc
            if kind == "unwritable":
                if self.db is not None and _full(exc):
                    # The WAL only restarts from its beginning after a checkpoint, and the automatic one waits for
                    # 1000 pages: on a small or nearly full disk it may never come, and every write then fails.
                    with contextlib.suppress(sqlite3.Error):
                        self.db.checkpoint()
                raise SpoolUnwritable(reason(exc)) from exc
            raise

    def _quarantine(self, why: str) -> Quarantine:
        counted: dict[str, int] = {}
        if self.db is not None:
            counted = {endpoint: sh.pending for endpoint, sh in self.db.cached_shares().items()}
        self._close()
        moved = quarantine_db(self.path, why)
        held = held_ids(moved) if moved is not None else {}
        record = Quarantine(moved, time.time(), why, held, counted)
        self.quarantines.append(record)
        return record
