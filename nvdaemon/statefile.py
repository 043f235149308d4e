"""Small files in stateDir that must survive a crash: written atomically, damaged ones moved aside.

A crash or power loss in the middle of a write must leave either the old file or the new one, never half of each:
write a temporary file beside the target, fsync it, rename it over the target, fsync the directory.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)


def ensure_dir(path: Path) -> None:
    """Create stateDir (mode 0700: it may hold delivery state and tokens' consequences, not for other users)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


def atomic_write(path: Path, data: bytes) -> None:
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
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
