"""End to end: ``nvdaemon run`` as a real subprocess on a copy of a fixture host.

Checks the exposition against a golden file (volatile series filtered; regenerate with NVDAEMON_UPDATE_GOLDEN=1)
and with ``promtool check metrics``; edits fixture files and watches ENTER and EXIT arrive in /v1/status; restarts
on the same stateDir without a repeated ENTER; reloads on SIGHUP (a bad config is kept out); exits 0 on SIGTERM
within the grace period; exits 2 on a broken config with the key path on stderr.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.polling import until_sync

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden" / "faulty.metrics"
GRACE = 5.0
VOLATILE = ("process_", "nodevitals_collector_duration_seconds", "nodevitals_tier_last_tick_timestamp_seconds")

CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: {grace}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
rules:
  - {{metric: load1, device: cpu, condition: load_high, threshold: 16, enterFor: 2, exitFor: 2}}
  - {{metric: temp_celsius, device: hwmon0/coretemp/temp1, condition: cpu_package_hot,
     severity: critical, threshold: 95, op: ">="}}
  - {{metric: psi_stall_ratio_avg10, device: memory, labels: {{share: some}}, condition: memory_pressure,
     threshold: 20}}
  - {{metric: pcie_aer_fatal_total, labels: {{error_type: TOTAL_ERR_FATAL}}, condition: pcie_aer_fatal,
     severity: critical, threshold: 0}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


wait_for = functools.partial(until_sync, timeout=60.0)  # a bound on failure only: each wait returns once true


# A bound on one request's failure only, as wait_for's: an answer that takes seconds on a starved CI runner (the
# agent at a third of a CPU beside make test-busy's burners) is not what these tests check.
REQUEST_TIMEOUT = 30.0


class HttpProbe:
    """GETs against an agent's HTTP port at ``base`` (``http://127.0.0.1:PORT``)."""

    base: str

    def get(self, path: str) -> tuple[int, bytes]:
        """The status and body; ``(0, what went wrong)`` when no answer came (refused, reset, timed out)."""
        try:
            with urllib.request.urlopen(self.base + path, timeout=REQUEST_TIMEOUT) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError as exc:
            return 0, repr(exc).encode()

    def status(self) -> dict[str, Any]:
        """``/v1/status``: conditions, recent events, tasks, sinks, reloads."""
        status, body = self.get("/v1/status")
        assert status == 200, f"/v1/status: {status} {body[:300]!r}{self.diagnosis()}"
        doc: dict[str, Any] = json.loads(body)
        return doc

    def diagnosis(self) -> str:
        """What a failed assertion adds about the process behind ``base`` (nothing by default)."""
        return ""


class Agent(HttpProbe):
    def __init__(self, tmp: Path, host: Path, config: Path) -> None:
        self.host, self.config = host, config
        self.port = int(config.read_text().split("127.0.0.1:")[1].split('"')[0])
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / "agent.log"
        self.log = self.log_path.open("ab")
        self.proc: subprocess.Popen[bytes] | None = None

    def diagnosis(self) -> str:
        """Whether the agent still runs, and the end of its log."""
        running = "not started" if self.proc is None else f"exit code {self.proc.poll()} (None: running)"
        tail = self.log_path.read_bytes()[-3000:].decode(errors="replace")
        return f"\nagent: {running}; the end of its log:\n{tail}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "nvdaemon", "run", "--host-root", str(self.host), "--config", str(self.config)]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log, cwd=ROOT)
        wait_for(lambda: self.get("/readyz")[0] == 200, "readyz 200")

    def ticks(self, tier: str = "core") -> int | None:
        """The tier's completed ticks, from ``/healthz`` (served over the probe lane even when every connection slot
        is taken); None when the probe was not answered (the lane full too)."""
        status, body = self.get("/healthz")
        if status not in (200, 503):
            return None
        count: int = json.loads(body)["ticks"].get(tier, 0)
        return count

    def wait_ticks(self, n: int, tier: str = "core") -> None:
        """Return once ``tier`` has completed ``n`` more ticks than now: what a "nothing happened" assertion waits
        for, so that it is checked after the ticks that would have made it happen, however slow the machine."""
        first: int = wait_for(lambda: (t := self.ticks(tier)) is not None and (t,), "/healthz answered")[0]
        wait_for(lambda: (self.ticks(tier) or 0) >= first + n, f"{n} more ticks of the {tier} tier (from {first})")

    def samples(self) -> list[dict[str, Any]]:
        """``/v1/state``: the Go agent's array of the last samples."""
        status, body = self.get("/v1/state")
        assert status == 200, f"/v1/state: {status} {body[:300]!r}{self.diagnosis()}"
        doc: list[dict[str, Any]] = json.loads(body)
        return doc

    def kill(self) -> None:
        """Test teardown: a still-running agent is killed and reaped (a no-op once it exited)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, grace: float = GRACE) -> tuple[int, float]:
        """SIGTERM, then the exit code and how long it took; ``grace``: the config's shutdownGraceSeconds."""
        assert self.proc is not None
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=grace + 10)
        return code, time.monotonic() - began


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", grace=GRACE, port=free_port()))
    a = Agent(tmp_path, host, config)
    yield a
    a.kill()


def stable_lines(exposition: str) -> str:
    keep = [line for line in exposition.splitlines() if not any(v in line for v in VOLATILE)]
    return "\n".join(keep) + "\n"


def conditions(agent: Agent) -> set[tuple[str, str]]:
    return {(c["condition"], c["device"]) for c in agent.status()["conditions"]}


def events(agent: Agent, condition: str, phase: str) -> list[dict[str, Any]]:
    return [e for e in agent.status()["recentEvents"] if e["condition"] == condition and e["phase"] == phase]


def test_metrics_match_golden_and_pass_promtool(agent: Agent) -> None:
    agent.start()
    # Two ticks, so load_high (enterFor 2) has entered and the exposition is settled.
    wait_for(lambda: ("load_high", "cpu") in conditions(agent), "load_high ENTER")
    status, body = agent.get("/metrics")
    assert status == 200
    text = body.decode()
    assert 'nodevitals_hw_load1{device="cpu",node="fixture-node",tier="core"} 24.51' in text
    if os.environ.get("NVDAEMON_UPDATE_GOLDEN"):
        GOLDEN.write_text(stable_lines(text))
    assert stable_lines(text) == GOLDEN.read_text(), "exposition drifted; NVDAEMON_UPDATE_GOLDEN=1 regenerates"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); make test installs it as root")
    check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, check=False)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    code, took = agent.stop()
    assert code == 0
    assert took < GRACE


def test_fixture_edits_raise_enter_then_exit_and_restart_keeps_state(agent: Agent) -> None:
    agent.start()
    wait_for(lambda: ("load_high", "cpu") in conditions(agent), "load_high ENTER")
    enter = events(agent, "load_high", "ENTER")
    assert len(enter) == 1 and enter[0]["detail"]["value"] == 24.51
    # Load drops: EXIT after exitFor=2 clear ticks, carrying the ENTER's start time.
    (agent.host / "proc" / "loadavg").write_text("0.50 0.40 0.30 2/1310 223344\n")
    exits = wait_for(lambda: events(agent, "load_high", "EXIT"), "load_high EXIT")
    assert exits[0]["started_at"] == enter[0]["started_at"]
    assert exits[0]["seq"] > enter[0]["seq"]
    assert ("load_high", "cpu") not in conditions(agent)
    # The sensor cools: cpu_package_hot (enterFor 1 by default) exits; the condition list follows.
    hwmon = next(
        p for p in (agent.host / "sys" / "class" / "hwmon").iterdir() if (p / "name").read_text() == "coretemp\n"
    )
    (hwmon / "temp1_input").write_text("60000\n")
    wait_for(lambda: events(agent, "cpu_package_hot", "EXIT"), "cpu_package_hot EXIT")
    # Load rises again: a fresh ENTER.
    (agent.host / "proc" / "loadavg").write_text("30.00 20.00 10.00 40/1310 223344\n")
    wait_for(lambda: len(events(agent, "load_high", "ENTER")) == 2, "second load_high ENTER")
    seq_before = agent.status()["eventSeq"]
    code, _ = agent.stop()
    assert code == 0

    # Restart on the same stateDir with the condition still breaching: no repeated ENTER, seq continues.
    agent.start()
    state = agent.status()
    assert ("load_high", "cpu") in {(c["condition"], c["device"]) for c in state["conditions"]}
    agent.wait_ticks(3)  # the restored condition is evaluated again (enterFor 2) before this checks for an ENTER
    assert events(agent, "load_high", "ENTER") == []
    (agent.host / "proc" / "loadavg").write_text("0.50 0.40 0.30 2/1310 223344\n")
    exits = wait_for(lambda: events(agent, "load_high", "EXIT"), "load_high EXIT after restart")
    assert exits[0]["seq"] > seq_before
    assert agent.stop()[0] == 0


def test_vanished_device_stays_active_and_stale(agent: Agent) -> None:
    agent.start()
    wait_for(lambda: ("pcie_aer_fatal", "0000:3b:00.0") in conditions(agent), "pcie_aer_fatal ENTER")
    shutil.rmtree(agent.host / "sys" / "bus" / "pci" / "devices" / "0000:3b:00.0")

    def stale() -> bool:
        return any(c["condition"] == "pcie_aer_fatal" and c["stale"] for c in agent.status()["conditions"])

    wait_for(stale, "stale condition")
    assert events(agent, "pcie_aer_fatal", "EXIT") == []
    assert agent.stop()[0] == 0


def test_sighup_reload_keeps_running_config_when_new_one_is_invalid(agent: Agent) -> None:
    agent.start()
    assert agent.proc is not None
    started = agent.status()["tasks"]["tier:core"]["startedAt"]
    wait_for(lambda: ("load_high", "cpu") in conditions(agent), "load_high ENTER")
    good = agent.config.read_text()
    agent.config.write_text(good + "bogusKey: 1\n")
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: agent.status()["reloads"]["rejected"] == 1, "rejected reload")
    assert agent.get("/healthz")[0] == 200
    # A valid change: the load rule's threshold goes above the fixture's load, so load_high never enters.
    agent.config.write_text(good.replace("threshold: 16", "threshold: 99"))
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: agent.status()["reloads"]["ok"] == 1, "accepted reload")
    tasks = agent.status()["tasks"]
    assert tasks["tier:core"]["state"] == "running"
    assert tasks["tier:core"]["startedAt"] == started  # only rules changed: the tier loop kept running
    assert tasks["http"]["restarts"] == 0
    assert ("load_high", "cpu") not in conditions(agent)  # its old rule was retired with an EXIT
    exits = events(agent, "load_high", "EXIT")
    assert [e["detail"].get("reason") for e in exits] == ["rule_removed"]
    assert agent.stop()[0] == 0


def test_broken_config_exits_2_with_key_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "rules:\n  - metric: load1\n    condition: x\n    threshold: 1\n    severty: warning\n"
        'sinks:\n  webhook:\n    - url: https://example.invalid/hook\n      secret: ["${HOOK_SECRET}"]\n'
    )
    cmd = [sys.executable, "-m", "nvdaemon", "run", "--config", str(bad)]
    env = {**os.environ, "HOOK_SECRET": "whsec_do-not-print-me"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT, env=env)
    assert proc.returncode == 2
    assert "rules[0].severty" in proc.stderr
    assert f"{bad}:5" in proc.stderr
    assert "sinks.webhook[0].secret" in proc.stderr
    assert "do-not-print-me" not in proc.stderr + proc.stdout
    check = subprocess.run(
        [sys.executable, "-m", "nvdaemon", "check-config", str(bad)], capture_output=True, text=True, check=False
    )
    assert check.returncode == 2 and "did you mean 'severity'" in check.stderr
