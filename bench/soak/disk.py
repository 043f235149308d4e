"""The soak's stateDir on a tmpfs of its own, so that a phase of the soak can fill it to the last byte (a ballast
file) and free it again. Mounting needs root; elsewhere the phase is skipped and the verdict says so."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from pathlib import Path

SIZE = "128m"  # room for the spool of a 10-minute soak, engine and NVSentinel state
CHUNK = 1 << 20


class StateDisk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False
        self.skipped: str | None = None  # why the stateDir could not get its own filesystem
        self.ballast = path / "ballast"

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            self.skipped = "not root: a tmpfs stateDir cannot be mounted, the full-stateDir phase is skipped"
            return
        cmd = ["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(self.path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            why = proc.stderr.strip() or proc.returncode
            self.skipped = f"mount failed ({why}): the full-stateDir phase is skipped"
            return
        self.mounted = True

    def fill(self) -> int:
        """Write the ballast until the filesystem is full; return its size in bytes."""
        return fill(self.ballast)

    def free(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.ballast.unlink()

    def unmount(self, keep: Path) -> None:
        """Copy what the stateDir holds to ``keep`` (for a post-mortem), then unmount it."""
        if not self.mounted:
            return
        self.free()
        with contextlib.suppress(OSError):
            shutil.copytree(self.path, keep, dirs_exist_ok=True)
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
        self.mounted = False


def fill(ballast: Path) -> int:
    """Write ``ballast`` until its filesystem is full, to the last byte; return its size in bytes."""
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    block = b"\0" * CHUNK
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(block) == 1:
                    break
                block = block[: len(block) // 2]  # the last bytes too
    finally:
        os.close(fd)
    return ballast.stat().st_size
