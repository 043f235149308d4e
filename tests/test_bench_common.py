"""bench/common.py's process CPU count and the release venv script's refusals: the figures of every benchmark of a
running agent rest on them. No timing is asserted: the child spins until its own count says it has used the CPU,
and the test compares two counts of that same CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.common import RELEASE_PYTHON, agent_python, cpu_seconds

ROOT = Path(__file__).resolve().parent.parent

# Spins 0.15 s of thread CPU in a thread that then exits, and 0.15 s in the main thread, says so, and waits.
CHILD = """
import sys, threading, time
def spin(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
t = threading.Thread(target=spin, args=(0.15,))
t.start()
t.join()
spin(0.15)
print("spun", flush=True)
sys.stdin.read()
"""


def test_cpu_seconds_counts_every_thread_the_process_had_at_a_finer_grain_than_proc() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "spun\n"
        counted = cpu_seconds(child.pid)
        fields = Path(f"/proc/{child.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    finally:
        child.kill()
        child.wait()
    # The thread that exited is in the count: 0.3 s of spinning, plus the interpreter's start.
    assert counted >= 0.3
    # /proc counts the same CPU in clock ticks, each rounded down.
    assert ticks <= counted + 0.02
    assert counted - ticks < 0.05


def test_cpu_seconds_of_a_process_that_is_gone_is_an_error() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(OSError):
        cpu_seconds(child.pid)


def test_agent_python_is_the_one_named_then_the_release_venv_then_this_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_AGENT_PYTHON", "/opt/some/python")
    assert agent_python() == "/opt/some/python"
    monkeypatch.delenv("BENCH_AGENT_PYTHON")
    assert agent_python() == (str(RELEASE_PYTHON) if RELEASE_PYTHON.exists() else sys.executable)


def release_venv(tmp_path: Path, python: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RELEASE_VENV": str(tmp_path / "venv"), "RELEASE_PYTHON": python}
    script = str(ROOT / "scripts" / "release-venv")
    return subprocess.run([script], check=False, env=env, capture_output=True, text=True)


def test_release_venv_refuses_a_missing_interpreter_and_says_which(tmp_path: Path) -> None:
    done = release_venv(tmp_path, str(tmp_path / "no-python"))
    assert done.returncode == 1
    assert f"{tmp_path / 'no-python'} not found" in done.stderr
    assert not (tmp_path / "venv").exists()


def test_release_venv_refuses_another_python_version(tmp_path: Path) -> None:
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\necho 3.9\n")
    fake.chmod(0o755)
    done = release_venv(tmp_path, str(fake))
    assert done.returncode == 1
    assert "is Python 3.9; the image runs 3.11" in done.stderr
    assert not (tmp_path / "venv").exists()
