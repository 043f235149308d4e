"""The Go binary's bare command line: ``nvdaemon`` with no arguments runs the agent as ``nodevitals`` did, reading
the Go default config path (``/etc/nodevitals/config.yaml``) when it exists; ``nvdaemon -config FILE`` (and
``--config FILE``, ``-config=FILE``) runs with that file. Help and unknown flags stay usage answers.

The agent is a real subprocess: ``python -m nvdaemon`` run through ``runpy`` with no arguments, after pointing
``nvdaemon.cli.GO_DEFAULT_CONFIG`` at a file under the test's directory (the constant is read at each call; nothing
is written to /etc). The config reads a copy of fixtures/hosts/faulty (``procRoot``/``sysRoot``/``devRoot``/``rootfs``,
as a bare command line cannot pass ``--host-root``) and binds a free loopback port.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdaemon import cli
from tests.test_e2e import GRACE, ROOT, HttpProbe, free_port, wait_for

# `python -m nvdaemon ARGS...` with the Go default path moved to argv[1] first.
LAUNCH = """
import runpy, sys
from pathlib import Path
import nvdaemon.cli
nvdaemon.cli.GO_DEFAULT_CONFIG = Path(sys.argv[1])
sys.argv = ["nvdaemon", *sys.argv[2:]]
runpy.run_module("nvdaemon", run_name="__main__", alter_sys=True)
"""

CONFIG = """
node: {node}
tiers: [core]
intervalSeconds: 0.3
procRoot: {host}/proc
sysRoot: {host}/sys
devRoot: {host}/dev
rootfs: {host}
stateDir: {state}
shutdownGraceSeconds: {grace}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
"""


class Bare(HttpProbe):
    """One agent started with the Go command line ``args``, the Go default path pointing at ``go_default``."""

    def __init__(self, tmp: Path, go_default: Path, args: list[str]) -> None:
        self.log_path = tmp / "agent.log"
        self.go_default, self.args = go_default, args
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = ""

    def start(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-c", LAUNCH, str(self.go_default), *self.args]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT)
        wait_for(lambda: self.exited() or self.get("/readyz")[0] == 200, "readyz 200 (or the agent's exit)")
        assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.log_path.read_text()}"

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=GRACE + 10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def host(tmp_path: Path) -> Path:
    copy = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", copy, symlinks=True)
    return copy


def write_config(path: Path, node: str, host: Path, port: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONFIG.format(node=node, host=host, state=path.parent / "state", grace=GRACE, port=port))
    return path


@pytest.fixture
def agents() -> Iterator[list[Bare]]:
    started: list[Bare] = []
    yield started
    for agent in started:
        agent.kill()


def test_bare_command_runs_with_the_go_default_path(tmp_path: Path, host: Path, agents: list[Bare]) -> None:
    port = free_port()
    go_default = write_config(tmp_path / "etc" / "nodevitals" / "config.yaml", "go-default-node", host, port)
    agent = Bare(tmp_path, go_default, [])  # `nvdaemon`, nothing else: a manifest with no args
    agents.append(agent)
    agent.start(port)
    doc = agent.status()
    assert (doc["node"], doc["config"]) == ("go-default-node", str(go_default))
    assert agent.stop() == 0
    assert f"config: {go_default}" in agent.log_path.read_text()


@pytest.mark.parametrize("flag", [["-config", "{}"], ["--config", "{}"], ["-config={}"]])
def test_go_config_flag_without_run(tmp_path: Path, host: Path, agents: list[Bare], flag: list[str]) -> None:
    """The flag's file wins over a Go default path that exists."""
    go_default = write_config(tmp_path / "etc" / "nodevitals" / "config.yaml", "go-default-node", host, free_port())
    port = free_port()
    given = write_config(tmp_path / "given" / "config.yaml", "flag-node", host, port)
    agent = Bare(tmp_path, go_default, [part.format(given) for part in flag])
    agents.append(agent)
    agent.start(port)
    doc = agent.status()
    assert (doc["node"], doc["config"]) == ("flag-node", str(given))
    assert agent.stop() == 0


def test_go_default_path_is_looked_up_at_each_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go_default = tmp_path / "config.yaml"
    monkeypatch.setattr(cli, "GO_DEFAULT_CONFIG", go_default)
    assert cli.config_path(None) is None  # absent: the embedded default
    go_default.write_text("node: n\n")
    assert cli.config_path(None) == str(go_default)
    assert cli.config_path("other.yaml") == "other.yaml"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdaemon", *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_still_prints_usage(flag: str) -> None:
    done = run_cli(flag)
    assert done.returncode == 0
    assert done.stdout.startswith("usage: nvdaemon") and "With no command" in done.stdout


def test_unknown_flag_is_a_usage_error() -> None:
    done = run_cli("--no-such-flag")
    assert done.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in done.stderr and done.stderr.startswith("usage: nvdaemon")
