"""End to end: ``nvdaemon run`` as a subprocess on a copy of the faulty fixture host, publishing to the test
platform-connector; assertions on the node condition an operator would see."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nvsentinel.conftest import TOKEN
from tests.nvsentinel.connector import FakeConnector
from tests.nvsentinel.e2e import agent_with_connector
from tests.test_e2e import ROOT, Agent, events, wait_for

CHECK = "NvdaemonCpuPackageHot"
CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: 5
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  nvsentinel: {{enabled: true, socketPath: {socket}, tokenPath: {token}, retryInitialSeconds: 0.1}}
rules:
  - {{metric: load1, device: cpu, condition: load_high, threshold: 16, enterFor: 2, exitFor: 2}}
  - {{metric: temp_celsius, device: hwmon0/coretemp/temp1, condition: cpu_package_hot,
     severity: critical, threshold: 95, op: ">="}}
"""


def reconciles(agent: Agent) -> int:
    count: int = agent.status()["sinks"]["nvsentinel"]["reconciles"]
    return count


def settled(agent: Agent, tier: str = "core") -> None:
    """Return once ``tier`` has ticked 3 times and then the NVSentinel sink has finished 2 more reconciles: all it
    would send about what those ticks found has been sent (or failed), so "nothing was sent" can be asserted."""
    agent.wait_ticks(3, tier)
    done = reconciles(agent)
    wait_for(lambda: reconciles(agent) >= done + 2, f"2 NVSentinel reconciles after {done}")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Agent, FakeConnector]]:
    yield from agent_with_connector(tmp_path, "faulty", CONFIG)


def status(connector: FakeConnector) -> str | None:
    cond = connector.condition(CHECK)
    return cond["status"] if cond else None


def test_fault_raises_node_condition_clear_flips_it_restart_keeps_state(setup: tuple[Agent, FakeConnector]) -> None:
    agent, connector = setup
    agent.start()
    wait_for(lambda: status(connector) == "True", "node condition True")
    cond = connector.condition(CHECK)
    assert cond is not None and cond["reason"] == f"{CHECK}IsNotHealthy"
    assert "Recommended Action=CONTACT_SUPPORT;" in cond["message"]
    wait_for(lambda: connector.events_for("NvdaemonLoadHigh"), "load_high as a Kubernetes Event")
    faults = [e for e in connector.ok_events() if e.checkName == CHECK and not e.isHealthy]
    assert len(faults) == 1

    # The connector records a call before its answer reaches the agent, which only then counts it reported.
    def both_reported() -> dict[str, Any] | None:
        sink: dict[str, Any] = agent.status()["sinks"]["nvsentinel"]
        done = sink["pending"] == 0 and {r["checkName"] for r in sink["reported"]} == {CHECK, "NvdaemonLoadHigh"}
        return sink if done else None

    sink = wait_for(both_reported, "both faults reported by the sink, nothing pending")
    assert sink["socketPresent"] is True
    assert TOKEN not in json.dumps(agent.status())
    _, metrics = agent.get("/metrics")
    text = metrics.decode()
    assert 'nvsentinel_health_events_publisher_sends_success_total{monitor="nvdaemon"} 4.0' in text
    assert 'nodevitals_nvsentinel_pending{monitor="nvdaemon"} 0.0' in text
    assert agent.stop()[0] == 0

    # Restart with the fault still there: no second unhealthy event, no second baseline.
    sent = len(connector.ok_events())
    agent.start()
    settled(agent)
    assert len(connector.ok_events()) == sent
    assert status(connector) == "True"

    # The sensor cools: the clear is delivered and the condition flips.
    hwmon = next(
        p for p in (agent.host / "sys" / "class" / "hwmon").iterdir() if (p / "name").read_text() == "coretemp\n"
    )
    (hwmon / "temp1_input").write_text("60000\n")
    wait_for(lambda: status(connector) == "False", "node condition False")
    assert connector.condition(CHECK) == {
        "type": CHECK,
        "status": "False",
        "reason": f"{CHECK}IsHealthy",
        "message": "No Health Failures",
    }
    auth = {c.metadata.get("authorization") for c in connector.calls()}
    assert auth == {f"Bearer {TOKEN}"}
    agent.log.flush()
    log = Path(str(agent.log.name)).read_bytes()
    assert b"nvsentinel: raise NvdaemonCpuPackageHot" in log
    assert TOKEN.encode() not in log
    assert agent.stop()[0] == 0


GPU_CONFIG = """
node: fixture-node
tiers: [core, gpu]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: 5
gpu: {{backend: fake, fakeScenario: "{scenario}"}}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  nvsentinel: {{enabled: true, socketPath: {socket}, tokenPath: {token}, retryInitialSeconds: 0.1}}
"""
LOST_CHECK = "NvdaemonGpuFallenOff"
NVML = ROOT / "fixtures" / "nvml"


@pytest.fixture
def gpu_setup(tmp_path: Path) -> Iterator[tuple[Agent, FakeConnector]]:
    yield from agent_with_connector(tmp_path, "healthy", GPU_CONFIG, scenario=NVML / "h100-8gpu-gpu5-lost-no-xid.json")


def lost_status(connector: FakeConnector) -> str | None:
    cond = connector.condition(LOST_CHECK)
    return cond["status"] if cond else None


def test_lost_gpu_condition_survives_a_restart_and_clears_when_the_gpu_answers(
    gpu_setup: tuple[Agent, FakeConnector],
) -> None:
    agent, connector = gpu_setup
    agent.start()
    wait_for(lambda: lost_status(connector) == "True", "NvdaemonGpuFallenOff True")
    cond = connector.condition(LOST_CHECK)
    assert cond is not None and "Recommended Action=RESTART_BM;" in cond["message"]
    (fault,) = [e for e in connector.ok_events() if e.checkName == LOST_CHECK and not e.isHealthy]
    assert fault.isFatal and list(fault.errorCode) == ["GPU_FALLEN_OFF_BUS"] and fault.nodeName == "fixture-node"
    assert {(e.entityType, e.entityValue) for e in fault.entitiesImpacted} == {
        ("GPU", "5"),
        ("GPU_UUID", "GPU-5a8b9d76-c2a7-4e5f-8b6d-0f1a2b3c4d56"),
        ("PCI", "00000000:AB:00.0"),
    }
    xid = connector.condition("NvdaemonGpuXidError")  # no XID was ever raised: only its baseline
    assert xid is not None and xid["status"] == "False"
    lost = wait_for(lambda: agent.status()["sinks"]["nvsentinel"]["lostGpus"], "the lost GPU in the sink's status")
    assert lost[0]["device"] == "gpu5"
    assert agent.stop()[0] == 0

    # Restart with the GPU still lost: it is seen lost again, its ENTER (restored with the engine state) is not
    # repeated, and nothing new is sent.
    sent = len(connector.ok_events())
    agent.start()
    settled(agent, tier="gpu")
    agent.log.flush()
    # The restarted agent saw gpu5 lost again (and said why it raised nothing): not merely a quiet tier.
    assert "gpu5 is still lost (gpu_lost ENTER" in Path(str(agent.log.name)).read_text()
    assert events(agent, "gpu_lost", "ENTER") == []
    assert len(connector.ok_events()) == sent and lost_status(connector) == "True"
    assert agent.stop()[0] == 0

    # The node rebooted and the GPU answers again (the healthy scenario: the same GPUs): the fault clears.
    agent.config.write_text(agent.config.read_text().replace("h100-8gpu-gpu5-lost-no-xid", "h100-8gpu-healthy"))
    agent.start()
    wait_for(lambda: lost_status(connector) == "False", "NvdaemonGpuFallenOff False")
    clear = connector.ok_events()[-1]
    assert clear.isHealthy and clear.checkName == LOST_CHECK and list(clear.errorCode) == ["GPU_FALLEN_OFF_BUS"]
    assert {(e.entityType, e.entityValue) for e in clear.entitiesImpacted} == {
        (e.entityType, e.entityValue) for e in fault.entitiesImpacted
    }
    wait_for(lambda: agent.status()["sinks"]["nvsentinel"]["lostGpus"] == [], "no lost GPU left in the sink's status")
    assert agent.stop()[0] == 0


POD_CONFIG = "tiers: [core]\nstateDir: {state}\nsinks:\n  metrics: {{listenAddr: '127.0.0.1:0'}}\n"


@pytest.mark.parametrize("command", ["run", "check-config"])
def test_a_pod_without_node_name_does_not_start(tmp_path: Path, command: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(POD_CONFIG.format(state=tmp_path / "state"))
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    env["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"  # only read, never contacted
    args = ["run", "--config", str(config)] if command == "run" else ["check-config", str(config)]
    host = ["--host-root", str(ROOT / "fixtures" / "hosts" / "healthy")]
    cmd = [sys.executable, "-m", "nvdaemon", *args, *host]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "node: not set and NODE_NAME is empty, inside Kubernetes" in done.stderr
    assert "fieldRef: {fieldPath: spec.nodeName}" in done.stderr and "- name: NODE_NAME" in done.stderr
    # The fix named in the error works: NODE_NAME from the downward API.
    if command == "check-config":
        env["NODE_NAME"] = "gpu-node-17"
        ok = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)
        assert ok.returncode == 0 and "ok (node gpu-node-17," in ok.stdout


def test_outside_kubernetes_the_hostname_stays_the_default(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(POD_CONFIG.format(state=tmp_path / "state"))
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_NAME", "KUBERNETES_SERVICE_HOST")}
    cmd = [sys.executable, "-m", "nvdaemon", "check-config", str(config)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0 and f"ok (node {socket.gethostname()}," in done.stdout
