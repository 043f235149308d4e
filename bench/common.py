"""Helpers shared by the benchmarks: ports, process CPU and RSS, percentiles, an agent subprocess that fails loudly
instead of hanging when it cannot start, and a ``/v1/events`` websocket client in its own thread."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import trio
import trio_websocket

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
_TICK = os.sysconf("SC_CLK_TCK")
SECRET = "whsec_YmVuY2gtc2VjcmV0LWJlbmNoLXNlY3JldC0xMjM0NTY3OA=="  # the webhook signing secret of the benchmarks
RELEASE_PYTHON = ROOT / ".venv-release" / "bin" / "python"  # scripts/release-venv


def agent_python() -> str:
    """The interpreter the benchmarks run ``nvdaemon run`` with: ``BENCH_AGENT_PYTHON`` when set, else the release
    venv's (``scripts/release-venv``, which ``make bench`` runs first: an optimized CPython 3.11 with the locked
    runtime set, as the image runs the agent), else the interpreter running the benchmark (``.venv``'s).

    The agent's CPU is nearly all interpreter, so a figure of a running agent is a figure of the interpreter's build
    too: the image's CPython is built with profile-guided and link-time optimization, a development machine's often
    is not (scripts/release-venv says why and by how much)."""
    chosen = os.environ.get("BENCH_AGENT_PYTHON")
    if chosen:
        return chosen
    return str(RELEASE_PYTHON) if RELEASE_PYTHON.exists() else sys.executable


def python_build(python: str) -> str:
    """``<path> (CPython <version>)`` of an interpreter, for the results' raw figures."""
    out = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True, check=True
    )
    return f"{python} (CPython {out.stdout.strip()})"


class BenchError(RuntimeError):
    """A benchmark could not run (the agent did not start, a reference failed); the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def rss_kib(pid: int) -> int:
    """Resident set size of a process, KiB (/proc/<pid>/status VmRSS)."""
    return _status_kib(pid, "VmRSS")


def peak_rss_kib(pid: int) -> int:
    """The highest resident set size a process has had, KiB (/proc/<pid>/status VmHWM)."""
    return _status_kib(pid, "VmHWM")


def cpu_seconds(pid: int, children: bool = False) -> float:
    """CPU seconds of a process, every thread it has had: its CPU-time clock (``clock_gettime`` on the clock id
    Linux gives each process, ``CPUCLOCK_SCHED``: nanoseconds of the scheduler's own count, exited threads
    included), or, where that cannot be read, utime+stime from /proc/<pid>/stat, which counts in the kernel's
    clock ticks (10 ms: over a 300 s window of 20 cycles that is 0.12 s an hour a tick). With ``children``:
    cutime+cstime, its reaped children (from /proc only)."""
    if not children:
        try:
            return time.clock_gettime(_process_clock(pid))
        except OSError:
            pass
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    # After the command: state is field 3; utime, stime, cutime, cstime are fields 14-17 (1-based).
    first = 13 if children else 11
    return (int(fields[first]) + int(fields[first + 1])) / _TICK


def _process_clock(pid: int) -> int:
    """The clock id of a process's CPU-time clock, as glibc's clock_getcpuclockid makes it (``~pid << 3 | 2``):
    Python has no call for another process's."""
    return ((~pid) << 3) | 2


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of the values; NaN when there are none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def stop_process(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM a process that still runs and reap it; SIGKILL it when it has not exited within ``timeout``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def copy_host(name: str, into: Path) -> Path:
    """A writable copy of a fixture host (fixtures/hosts/<name>) under ``into``, with a boot id when the fixture has
    none (the NVSentinel sink reads it)."""
    host = into / "host"
    shutil.copytree(FIXTURES / "hosts" / name, host, symlinks=True)
    boot = host / "proc" / "sys" / "kernel" / "random" / "boot_id"
    if not boot.exists():
        boot.parent.mkdir(parents=True, exist_ok=True)
        boot.write_text("11111111-2222-4333-8444-555555555555\n")
    return host


def gpunode_with_disks(tmp: Path) -> Path:
    """A copy of gpunode (its /proc, /sys, and the boot id the NVSentinel sink reads) with the fixture disks under
    dev/ (the smart tier's devRoot): the host the steady and RSS benchmarks run every tier on."""
    root = copy_host("gpunode", tmp)
    (root / "dev").mkdir(exist_ok=True)
    for node in (FIXTURES / "hosts" / "disks" / "dev").iterdir():
        shutil.copy(node, root / "dev" / node.name, follow_symlinks=False)
    return root


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class AgentProcess:
    """``nvdaemon run`` as a subprocess with a config (a dict, written as JSON, which is YAML) and a host root, on
    ``python`` (``agent_python()`` by default).

    Entering waits for /readyz; an agent that exits, logs an import error, or is not ready within ``ready_timeout``
    raises ``BenchError`` with the end of its log, so a benchmark never hangs on an agent that cannot start.
    """

    def __init__(self, config: dict[str, Any], host_root: Path | None = None, python: str | None = None) -> None:
        self.python = python or agent_python()
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="nvdaemon-bench-"))
        sinks = config.setdefault("sinks", {})
        sinks.setdefault("metrics", {})["listenAddr"] = f"127.0.0.1:{self.port}"
        config.setdefault("stateDir", str(self.tmp / "state"))
        self.config_path = self.tmp / "config.yaml"
        self.config_path.write_text(json.dumps(config, indent=1))
        self.log_path = self.tmp / "agent.log"
        self.host_root = host_root
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_timeout = 60.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, lines: int = 25) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> AgentProcess:
        cmd = [self.python, "-m", "nvdaemon", "run", "--config", str(self.config_path), "--log-level", "warning"]
        if self.host_root is not None:
            cmd += ["--host-root", str(self.host_root)]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise BenchError(f"the agent exited with {self.proc.returncode} at start:\n{self.log_tail()}")
            self._check_log()
            try:
                if get(self.url + "/readyz", timeout=2)[0] == 200:
                    # A tier task that failed at start still lets /readyz turn 200 (it is restarted with backoff):
                    # its error is logged before, so the log says whether the agent really runs what was asked.
                    self._check_log()
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise BenchError(f"the agent was not ready after {self.ready_timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _check_log(self) -> None:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        if missing := re.search(r"ModuleNotFoundError: (No module named '[^']+')", text):
            raise BenchError(f"the agent failed at start: {missing[1]}\n{self.log_tail()}")
        if failed := re.search(r"task (tier:\S+|http) failed \((.*?)\); restart", text):
            raise BenchError(f"the agent's {failed[1]} task failed at start: {failed[2]}\n{self.log_tail()}")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            stop_process(self.proc, 15)
        shutil.rmtree(self.tmp, ignore_errors=True)


class EventClient:
    """A ``/v1/events`` websocket client in its own thread (its own Trio loop); notes each CloudEvent's wall-clock
    arrival. ``start`` returns once connected."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.lock = threading.Lock()
        self.arrived: list[tuple[float, dict[str, Any]]] = []
        self.error: BaseException | None = None
        self._connected = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, timeout: float = 10.0) -> EventClient:
        self._thread.start()
        if not self._connected.wait(timeout):
            raise BenchError(f"websocket client: not connected after {timeout:g}s ({self.error!r})")
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def events(self) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return list(self.arrived)

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self.error = exc

    async def _main(self) -> None:
        async with trio_websocket.open_websocket_url(f"ws://127.0.0.1:{self.port}/v1/events") as ws:
            self._connected.set()
            while not self._stop.is_set():
                with trio.move_on_after(0.2):
                    message = await ws.get_message()
                    at = time.time()
                    doc = json.loads(message)
                    if doc.get("type") != "control" and doc.get("type") != "ping":
                        with self.lock:
                            self.arrived.append((at, doc))
