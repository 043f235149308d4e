"""smartctl's output is read through a byte limit: a smartctl that prints without end (on stdout or stderr) is
killed once it passed the limit, its device reported in state ``error`` (a counted collector error, not an absent
disk), and the bytes it managed to write stay near the limit (the reader never asked for the rest)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from nvdaemon.collectors import smart_edge
from nvdaemon.collectors.base import HostRoots
from tests.smart.conftest import DISKS, collector, cycle, pid_running

STDOUT_LIMIT, STDERR_LIMIT, CHUNK = 1024 * 1024, 64 * 1024, 64 * 1024  # the documented limits, one pipe read
TOTAL = 32 * 1024 * 1024  # what the runaway would print if nobody stopped it (then it would hang holding the pipe)

# Writes 64 KiB at a time to the chosen stream, recording its pid and, after every complete write, the bytes written
# so far: what the agent let it write before killing it.
RUNAWAY = """#!{python}
import os, sys, time
log = {log!r}
with open(log + ".pid", "w") as f:
    f.write(str(os.getpid()))
fd = {fd}
chunk = b"x" * 1023 + b"\\n"
chunk *= 64
written = 0
count = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.pwrite(count, b"%012d" % 0, 0)  # fixed width, written in place: a kill never leaves it torn
while written < {total}:
    os.write(fd, chunk)
    written += len(chunk)
    os.pwrite(count, b"%012d" % written, 0)
time.sleep(3600)
"""


def runaway(tmp_path: Path, fd: int) -> Path:
    script = tmp_path / "smartctl"
    log = tmp_path / "written"
    script.write_text(RUNAWAY.format(python=os.path.realpath(sys.executable), log=str(log), fd=fd, total=TOTAL))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize(("fd", "stream", "limit"), [(1, "stdout", STDOUT_LIMIT), (2, "stderr", STDERR_LIMIT)])
def test_a_runaway_smartctl_is_killed_at_the_limit(tmp_path: Path, fd: int, stream: str, limit: int) -> None:
    c = collector(timeout=5.0, devices=["nvme0n1"])
    c.smartctl_path = str(runaway(tmp_path, fd))
    roots: HostRoots = DISKS
    gathered, samples = cycle(c, roots)

    (outcome,) = gathered.data
    assert outcome.state == "error", outcome  # before the limit: read whole, then a timeout or a parse error
    assert f"more than {limit // 1024} KiB on {stream}" in outcome.reason
    assert gathered.errors == [f"nvme0n1: error: {outcome.reason}"]  # counted and logged by the tier
    assert c.status["nvme0n1"].state == "error" and not c.status["nvme0n1"].readable
    assert c.detail()["unreadable"] == ["nvme0n1"]
    assert not [s for s in samples if s.device == "nvme0n1"]

    pid = int((tmp_path / "written.pid").read_text())
    assert not pid_running(pid)  # killed and reaped before gather returned
    written = int((tmp_path / "written").read_text())
    # The reader stopped at the limit: what the child wrote is the limit, one read and what the pipe holds, not all.
    assert written <= limit + CHUNK + 1024 * 1024 < TOTAL, written


def test_the_limits_are_the_documented_ones() -> None:
    assert (smart_edge.STDOUT_LIMIT, smart_edge.STDERR_LIMIT, smart_edge.CHUNK) == (STDOUT_LIMIT, STDERR_LIMIT, CHUNK)


def test_output_under_the_limit_is_read_whole(tmp_path: Path) -> None:
    script = tmp_path / "smartctl"
    script.write_text("#!/bin/sh\nhead -c 900000 /dev/zero | tr '\\0' 'y'\nprintf 'oops' >&2\nexit 3\n")
    script.chmod(0o755)
    call = smart_edge.run_smartctl([str(script)], timeout=10)
    assert (call.returncode, len(call.stdout), call.stderr) == (3, 900_000, "oops")
