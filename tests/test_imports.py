"""An agent loads a dependency only where it is used: import cost is resident memory (bench/rss.py), and the chart's
pods must fit 64 MiB.

Each case runs ``nvdaemon run`` (``nvdaemon.cli.main``) as a real subprocess on a copy of a fixture host until
/readyz is 200 (every tier has ticked) and /metrics and /v1/status have been served, stops it with SIGTERM, and reads
the ``sys.modules`` it ended with. A pod without NVSentinel or pod attribution never loads grpc or protobuf (one
that sends to NVSentinel loads both: its call goes through grpcio, only once the sink is enabled); a core pod
without webhooks or history never loads httpx or sqlite3; the core tier never loads pySMART or nvidia-ml-py.
And the agent's threads share at most ``MALLOC_ARENAS`` glibc malloc arenas (``nvdaemon.cli.cap_malloc_arenas``).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvdaemon.cli import MALLOC_ARENAS
from tests.nvsentinel.connector import FakeConnector
from tests.polling import until_sync

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
# Runs the agent's command line, then writes the modules the process ended with (argv[1]) as a JSON list.
WRAPPER = """
import json, sys
from nvdaemon.cli import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as out:
    json.dump(sorted(sys.modules), out)
sys.exit(code)
"""
GRPC = ("grpc", "google.protobuf")
SMART = ("pySMART",)
NVML = ("pynvml",)
WEBHOOK_HISTORY = ("httpx", "sqlite3", "_sqlite3")

wait_for = functools.partial(until_sync, timeout=30.0)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            resp.read()
            status: int = resp.status
            return status
    except (urllib.error.URLError, OSError):
        return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def modules_of_agent(tmp: Path, config: dict[str, Any], done: Callable[[], bool] = lambda: True) -> set[str]:
    """The modules a ``nvdaemon run`` with ``config`` on a copy of fixtures/hosts/gpunode ended with, stopped once
    it is ready and ``done()`` holds."""
    host = tmp / "host"
    shutil.copytree(FIXTURES / "hosts" / "gpunode", host, symlinks=True)
    port = _free_port()
    config = {
        "node": "import-node",
        "intervalSeconds": 0.5,
        "stateDir": str(tmp / "state"),
        **config,
        "sinks": {**config.get("sinks", {}), "metrics": {"listenAddr": f"127.0.0.1:{port}"}},
    }
    path = tmp / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    out = tmp / "modules.json"
    cmd = [sys.executable, "-c", WRAPPER, str(out), "run", "--host-root", str(host), "--config", str(path)]
    with (tmp / "agent.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: proc.poll() is not None or _get(base + "/readyz") == 200, "readyz 200")
        assert proc.poll() is None, (tmp / "agent.log").read_text()
        assert _get(base + "/metrics") == 200
        assert _get(base + "/v1/status") == 200
        wait_for(lambda: proc.poll() is not None or done(), "done")
        assert proc.poll() is None, (tmp / "agent.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, (tmp / "agent.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    loaded = set(json.loads(out.read_text()))
    assert {"trio", "nvdaemon.app", "nvdaemon.server.app"} <= loaded  # the agent really ran in this process
    return loaded


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


CASES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "core": ({"tiers": ["core"]}, GRPC + SMART + NVML + WEBHOOK_HISTORY + ("trio_websocket",)),
    "core-nodeexporter": ({"tiers": ["core"], "nodeExporter": {"enabled": True}}, GRPC + SMART + NVML),
    "gpu-dcgm": (
        {
            "tiers": ["gpu"],
            "gpu": {"backend": "fake", "fakeScenario": str(FIXTURES / "nvml" / "h100-8gpu-thermal-throttle.json")},
            "dcgmCompat": {"enabled": True},
        },
        GRPC + SMART,
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_agent_loads_only_what_its_config_uses(tmp_path: Path, case: str) -> None:
    config, absent = CASES[case]
    assert _loaded(modules_of_agent(tmp_path, config), absent) == []


def test_an_agent_sending_to_nvsentinel_loads_grpc_for_its_call(tmp_path: Path) -> None:
    connector = FakeConnector(tmp_path / "pc.sock", "import-node", None).start()
    config = {
        "tiers": ["gpu"],
        "gpu": {"backend": "fake", "fakeScenario": str(FIXTURES / "nvml" / "h100-8gpu-thermal-throttle.json")},
        "sinks": {"nvsentinel": {"enabled": True, "socketPath": str(connector.socket_path), "tokenPath": ""}},
    }
    try:
        # Stopped only after the platform-connector (a grpcio server, in this process) took a call from the agent.
        modules = modules_of_agent(tmp_path, config, done=lambda: bool(connector.ok_events()))
    finally:
        connector.stop()
    assert "nvdaemon.sinks.nvsentinel.reconciler" in modules
    assert {"grpc", "google.protobuf"} <= modules


# Eight threads that each hold a malloc'd block, then glibc's own count of its arenas (malloc_stats, on stderr).
ARENAS = """
import ctypes, sys, threading
from nvdaemon.cli import cap_malloc_arenas
if sys.argv[1] == "cap":
    assert cap_malloc_arenas()
held, ready, done = [], threading.Barrier(9), threading.Event()
def work():
    held.append(bytearray(100_000))  # over pymalloc's limit, under the mmap threshold: from the thread's arena
    ready.wait()
    done.wait()
threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
ctypes.CDLL(None).malloc_stats()
done.set()
for t in threads:
    t.join()
"""


def _arenas(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    cmd = [sys.executable, "-c", ARENAS, mode]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return sum(1 for line in proc.stderr.splitlines() if line.startswith("Arena "))


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_malloc_arenas_are_capped_for_the_agents_threads() -> None:
    assert _arenas("nocap") > MALLOC_ARENAS  # the test sees what it means to: a thread each, uncapped
    assert _arenas("cap") <= MALLOC_ARENAS
