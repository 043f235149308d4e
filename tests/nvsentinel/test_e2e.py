"""End to end: ``nvdaemon run`` as a subprocess on a copy of the faulty fixture host, publishing to the test
platform-connector; assertions on the node condition an operator would see."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nvsentinel.conftest import TOKEN
from tests.nvsentinel.connector import FakeConnector
from tests.nvsentinel.e2e import agent_with_connector
from tests.test_e2e import Agent, wait_for

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

    sink = agent.state()["sinks"]["nvsentinel"]
    assert sink["socketPresent"] is True and sink["pending"] == 0
    assert {r["checkName"] for r in sink["reported"]} == {CHECK, "NvdaemonLoadHigh"}
    assert TOKEN not in json.dumps(agent.state())
    _, metrics = agent.get("/metrics")
    text = metrics.decode()
    assert 'nvsentinel_health_events_publisher_sends_success_total{monitor="nvdaemon"} 4.0' in text
    assert 'nodevitals_nvsentinel_pending{monitor="nvdaemon"} 0.0' in text
    assert agent.stop()[0] == 0

    # Restart with the fault still there: no second unhealthy event, no second baseline.
    sent = len(connector.ok_events())
    agent.start()
    time.sleep(1.0)  # several ticks at 0.3 s
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
