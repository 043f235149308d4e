"""A SIGHUP that changes ``node`` and ``stateDir`` restarts the NVSentinel sink: it publishes under the new node name
and keeps its state under the new stateDir (``nvdaemon run`` as a subprocess, the test platform-connector on a Unix
socket). The sink's fingerprint is what it was built from, not what the agent holds when the reload compares them."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nvsentinel.connector import FakeConnector
from tests.nvsentinel.e2e import agent_with_connector
from tests.test_e2e import Agent, wait_for

CHECK = "NvdaemonCpuPackageHot"
CONFIG = """
node: {node}
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: 5
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  nvsentinel: {{enabled: true, socketPath: {socket}, tokenPath: {token}, retryInitialSeconds: 0.1}}
rules:
  - {{metric: temp_celsius, device: hwmon0/coretemp/temp1, condition: cpu_package_hot,
     severity: critical, threshold: 95, op: ">="}}
"""


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Agent, FakeConnector]]:
    yield from agent_with_connector(tmp_path, "faulty", CONFIG, node="node-a")


def faults_for(connector: FakeConnector, node: str) -> list[str]:
    """The checks acknowledged as unhealthy for ``node``."""
    return [e.checkName for e in connector.ok_events() if e.nodeName == node and not e.isHealthy]


def reported(state_dir: Path) -> set[str]:
    """The checks the sink's state file in ``state_dir`` says NVSentinel holds."""
    path = state_dir / "nvsentinel.json"
    if not path.exists():
        return set()
    return {h["check_name"] for h in json.loads(path.read_bytes())["reported"]}


def test_reload_changing_node_and_state_dir_publishes_under_the_new_node(
    tmp_path: Path, setup: tuple[Agent, FakeConnector]
) -> None:
    agent, connector = setup
    connector.node = "node-a"
    agent.start()
    assert agent.proc is not None
    wait_for(lambda: CHECK in faults_for(connector, "node-a"), "the fault published for node-a")
    wait_for(lambda: CHECK in reported(tmp_path / "state"), "the fault in the first stateDir")

    # The node is renamed (the platform-connector of node-b answers now) and the state moves to a new directory.
    new_state = tmp_path / "state-b"
    text = agent.config.read_text().replace("node: node-a", "node: node-b")
    agent.config.write_text(text.replace(f"stateDir: {tmp_path / 'state'}\n", f"stateDir: {new_state}\n"))
    connector.node = "node-b"
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: agent.status()["reloads"]["ok"] == 1, "the reload accepted")

    wait_for(lambda: CHECK in faults_for(connector, "node-b"), "the fault published for node-b")
    wait_for(lambda: CHECK in reported(new_state), "the fault in the new stateDir")
    # The state file is written once the connector answered; `pending` is counted again after that.
    wait_for(lambda: agent.status()["sinks"]["nvsentinel"]["pending"] == 0, "nothing pending")
    sink = agent.status()["sinks"]["nvsentinel"]
    assert {r["checkName"] for r in sink["reported"]} >= {CHECK}
    assert agent.stop()[0] == 0
