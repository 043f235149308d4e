"""Real filesystems that refuse writes, for the spool tests: a small tmpfs (full with a ballast file), a read-only
one. Mounting needs root; elsewhere the tests that need it skip, saying why."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.soak import disk


def can_mount() -> str | None:
    """Why a tmpfs cannot be mounted here, or None."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (the real full-disk and read-only stateDir cases)"
    return None


@contextlib.contextmanager
def tmpfs(path: Path, size: str, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``256k``) mounted at ``path`` for the block; skips the test where it cannot be."""
    why = can_mount()
    if why:
        pytest.skip(why)
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700" + (",ro" if read_only else "")
    cmd = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(directory: Path, leave: int = 0) -> Path:
    """Write a ballast file into ``directory`` until the filesystem is full, then give back ``leave`` bytes."""
    ballast = directory / "ballast"
    size = disk.fill(ballast)
    if leave:
        os.truncate(ballast, max(0, size - leave))
    return ballast
