"""Small files in stateDir that must survive a crash: written atomically, damaged ones moved aside.

A crash or power loss in the middle of a write must leave either the old file or the new one, never half of each:
write a temporary file beside the target, fsync it, rename it over the target, fsync the directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


def ensure_dir(path: Path) -> None:
    """Create stateDir (mode 0700: it may hold delivery state and tokens' consequences, not for other users)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def atomic_write(path: Path, data: bytes) -> None:
    """Raises OSError (ENOSPC, EROFS, EACCES, EIO): the target is then untouched and no temporary file is left."""
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:  # os.write may write less than asked (a signal, a nearly full disk)
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        # A half-written temporary file on a full disk would only keep it full.
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def quarantine(path: Path, why: str) -> Path:
    """Move a damaged file aside (kept for a post-mortem) so the agent can start fresh instead of crash-looping."""
    stamp = int(time.time())
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while target.exists():  # never overwrite an earlier damaged copy
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.replace(path, target)
    log.error("state file %s is unreadable (%s); moved to %s and starting fresh", path, why, target)
    return target


def quarantine_db(path: Path, why: str) -> Path | None:
    """Move a damaged sqlite database aside with its WAL and shared-memory files (``<moved>-wal``, ``<moved>-shm``:
    the names sqlite looks for, so opening the moved copy reads its WAL too). Returns the moved database, or None
    when only companion files were there."""
    moved = quarantine(path, why) if path.exists() else None
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if not extra.exists():
            continue
        if moved is not None:
            os.replace(extra, Path(f"{moved}{suffix}"))
        else:
            quarantine(extra, why)
    return moved
