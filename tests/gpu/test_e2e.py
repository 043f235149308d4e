"""End to end: ``nvdaemon run`` as a subprocess with ``tiers: [core, gpu]`` on the fake NVML (the XID 79 scenario):
gpu samples and the dcgm surface in /metrics, the XID and the lost GPU in /v1/status, and the XID delivered to the
test platform-connector as an NvdaemonGpuXidError node condition, the lost GPU as NvdaemonGpuFallenOff."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpu.conftest import XID79
from tests.nvsentinel.connector import FakeConnector
from tests.nvsentinel.e2e import agent_with_connector
from tests.test_e2e import Agent, wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
node: fixture-node
tiers: [core, gpu]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: 5
gpu: {{backend: fake, fakeScenario: "{scenario}"}}
dcgmCompat: {{enabled: true}}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  nvsentinel: {{enabled: true, socketPath: {socket}, tokenPath: {token}, retryInitialSeconds: 0.1}}
"""


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Agent, FakeConnector]]:
    yield from agent_with_connector(tmp_path, "healthy", CONFIG, scenario=XID79)


def test_gpu_samples_xid_event_lost_gpu_and_nvsentinel_condition(setup: tuple[Agent, FakeConnector]) -> None:
    agent, connector = setup
    agent.start()
    metrics = agent.get("/metrics")[1].decode()
    assert 'nodevitals_hw_gpu_temperature_celsius{device="gpu3",gpu_model="NVIDIA H100 80GB HBM3"' in metrics
    assert 'nodevitals_hw_load1{device="cpu",node="fixture-node",tier="core"}' in metrics
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in metrics

    def xid_events() -> list[dict[str, object]]:
        return [e for e in agent.status()["recentEvents"] if e["condition"] == "gpu_xid_error"]

    (xid,) = wait_for(xid_events, "the XID 79 event in /v1/status")
    assert (xid["device"], xid["severity"], xid["phase"], xid["tier"]) == ("gpu3", "critical", "ENTER", "gpu")
    assert xid["detail"] == {
        "xid": 79,
        "description": "GPU has fallen off the bus",
        "gpu_uuid": "GPU-3e6f7b54-a085-4c3d-8f4b-8d9e0f1a2b34",
        "pci_bus_id": "00000000:5D:00.0",
        "sources": ["nvml"],  # the fixture host has no dev/kmsg
    }
    wait_for(
        lambda: [e for e in agent.status()["recentEvents"] if e["condition"] == "gpu_lost" and e["device"] == "gpu3"],
        "gpu_lost for gpu3",
    )
    cond = wait_for(
        lambda: (c := connector.condition("NvdaemonGpuXidError")) and c["status"] == "True" and c,
        "NvdaemonGpuXidError node condition",
    )
    assert cond["reason"] == "NvdaemonGpuXidErrorIsNotHealthy"
    assert "Recommended Action=RESTART_BM;" in cond["message"]
    (fault,) = [e for e in connector.ok_events() if e.checkName == "NvdaemonGpuXidError" and not e.isHealthy]
    assert list(fault.errorCode) == ["79"] and fault.isFatal and fault.componentClass == "GPU"
    entities = {(e.entityType, e.entityValue) for e in fault.entitiesImpacted}
    assert entities == {("PCI", "00000000:5D:00.0"), ("GPU_UUID", "GPU-3e6f7b54-a085-4c3d-8f4b-8d9e0f1a2b34")}
    # The lost GPU is a fault of its own, beside the XID 79 (which it would be without one, too).
    lost = wait_for(
        lambda: (c := connector.condition("NvdaemonGpuFallenOff")) and c["status"] == "True" and c,
        "NvdaemonGpuFallenOff node condition",
    )
    assert (
        "ErrorCode:GPU_FALLEN_OFF_BUS GPU:3 " in lost["message"] and "Recommended Action=RESTART_BM;" in lost["message"]
    )
    metrics = agent.get("/metrics")[1].decode()
    assert 'nodevitals_hw_gpu_xid_errors_total{device="gpu3"' in metrics and 'xid="79"} 1.0' in metrics
    assert 'err_code="79",err_msg="GPU has fallen off the bus"} 79' in metrics
    assert (
        'nodevitals_events_total{condition="gpu_xid_error",device="gpu3",node="fixture-node",phase="ENTER",'
        'severity="critical",tier="gpu",xid="79"} 1.0'
    ) in metrics
    code, took = agent.stop()
    assert code == 0 and took < 5
