"""scripts/test-busy (`make test-busy`), run as a real subprocess with ``make`` replaced by a recording stand-in on
PATH: the burners run while the suite runs, one per core by default, the suite runs BUSY_RUNS times and stops at the
first failure with its exit code, and no burner outlives the script."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "test-busy"
BASH = shutil.which("bash") or "/bin/bash"

# make: logs its arguments, the thread delay it was given, and whether each burner the script named is alive.
MAKE = """#!{bash}
echo "make $* delay=$NVDAEMON_TEST_THREAD_DELAY" >>"{log}"
for pid in $(sed -n 's/.*(pids \\([0-9 ]*\\)).*/\\1/p' "{out}"); do
  if kill -0 "$pid" 2>/dev/null; then echo "burner $pid alive" >>"{log}"; fi
done
n=$(grep -c '^make ' "{log}")
[ "$n" -ge "{fail_at}" ] && exit 3
exit 0
"""


def run(tmp_path: Path, *, fail_at: int = 99, **env: str) -> tuple[int, str, list[int]]:
    """The script's exit code, the stand-in's log, and the burner pids the script printed."""
    bin_dir, log, out = tmp_path / "bin", tmp_path / "calls.log", tmp_path / "out.txt"
    bin_dir.mkdir()
    log.touch()
    (bin_dir / "make").write_text(MAKE.format(bash=BASH, log=log, out=out, fail_at=fail_at))
    (bin_dir / "make").chmod(0o755)
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable}
    for name in ("NVDAEMON_TEST_THREAD_DELAY", "BUSY_RUNS", "BUSY_BURNERS", "ARGS"):  # set under make test-busy
        environ.pop(name, None)
    environ.update(env)
    with out.open("w") as sink:
        cmd = [BASH, str(SCRIPT)]
        proc = subprocess.run(cmd, check=False, stdout=sink, stderr=subprocess.STDOUT, env=environ, timeout=120)
    text = out.read_text()
    found = re.search(r"\(pids ([0-9 ]+)\)", text)
    assert found, text
    return proc.returncode, log.read_text(), [int(p) for p in found.group(1).split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it has exited, only its parent has not reaped it.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_burners_run_beside_each_run_and_are_gone_after(tmp_path: Path) -> None:
    code, log, pids = run(tmp_path, BUSY_RUNS="3", BUSY_BURNERS="2", ARGS="-q tests/x")
    assert code == 0
    assert log.count("make test ARGS=-q tests/x delay=0.02") == 3
    assert all(log.count(f"burner {pid} alive") == 3 for pid in pids) and len(pids) == 2
    assert not any(alive(pid) for pid in pids)


def test_a_failed_run_stops_the_runs_with_its_code_and_the_burners(tmp_path: Path) -> None:
    code, log, pids = run(tmp_path, fail_at=2, BUSY_RUNS="3", NVDAEMON_TEST_THREAD_DELAY="0.2")
    assert code == 3
    assert log.count("make test") == 2 and "delay=0.2" in log
    assert len(pids) == len(os.sched_getaffinity(0))  # one per core, as nproc counts them
    assert not any(alive(pid) for pid in pids)
