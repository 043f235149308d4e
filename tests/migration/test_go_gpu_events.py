"""A migrating operator's GPU rows, on a running agent: XID events on the webhook, throttle series, the drop counter.

Two agents run the gpu tier on the fake NVML (``fixtures/nvml``) with a signed webhook receiver, as the Go agent
would be run with its chart's ``gpuRules``:

- ``h100-8gpu-xid79-lost.json``: gpu3 reports XID 79. The webhook gets one ``gpu_xid_error`` ENTER with the Go
  table's severity (critical) and ``detail {xid, description}``, never an EXIT; ``nodevitals_events_total`` counts it
  with ``xid="79"``. A second endpoint rejects every event (HTTP 400, ``maxAttempts: 1``): once its events are given
  up, ``nodevitals_delivery_dropped_total{sink="webhook:http://127.0.0.1:<port>"}`` counts them, path and query cut.
- ``h100-8gpu-thermal-throttle.json``: gpu5 is throttled for sw+hw thermal slowdown (mask 0x60) at 88 C and gpu2 is
  at its software power cap (0x04). ``gpu_throttle_active{reason}`` is 1 for exactly the set non-benign reasons,
  benign reasons never appear, and Go's ``gpu_hot`` rule (> 85 for 3 samples) enters for gpu5 with
  ``detail {value, threshold}``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.node_exporter.exposition import ParsedFamily, parse
from tests.sinks.helpers import SECRET
from tests.sinks.receiver import Receiver
from tests.test_e2e import ROOT, Agent, free_port, wait_for

HOST = ROOT / "fixtures" / "hosts" / "nodevitals"
NVML = ROOT / "fixtures" / "nvml"
NODE = "gpu-node"
GPU_LABELS = {"node", "tier", "device", "gpu_uuid", "gpu_model", "pci_bus_id"}
NON_BENIGN = {"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
BENIGN = {"gpu_idle", "app_clocks_setting", "sync_boost", "display_clock_setting"}

# The Go chart's default gpuRules (contract §5), as a Go values file renders them.
CONFIG = """
node: {node}
tiers: [gpu]
intervalSeconds: 1
stateDir: {state}
shutdownGraceSeconds: 5
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  webhook:
    - url: {url}
      secret: ${{MIGRATION_WEBHOOK_SECRET}}
    - url: {rejecting}
      secret: ${{MIGRATION_WEBHOOK_SECRET}}
      maxAttempts: 1
rules:
  - {{metric: gpu_temperature_celsius, device: "", condition: gpu_hot, severity: warning, threshold: 85,
     enterFor: 3, exitFor: 3}}
  - {{metric: gpu_ecc_uncorrected_total, device: "", condition: gpu_ecc_uncorrected, severity: critical,
     threshold: 0, enterFor: 1, exitFor: 1}}
gpu: {{backend: fake, fakeScenario: {scenario}}}
"""


@dataclass
class Run:
    agent: Agent
    rx: Receiver  # accepts every event
    rejecting: Receiver  # answers 400 to every event

    def metrics(self) -> dict[str, ParsedFamily]:
        status, body = self.agent.get("/metrics")
        assert status == 200
        return parse(body.decode())

    def events(self, condition: str) -> list[dict[str, Any]]:
        with self.rx.lock:
            return [r.data for r in self.rx.received if r.data and r.data.get("condition") == condition]


def _run(tmp: Path, scenario: str) -> Iterator[Run]:
    host = tmp / "host"
    shutil.copytree(HOST, host, symlinks=True)
    rx, rejecting = Receiver(secret=SECRET).start(), Receiver(secret=SECRET)
    rejecting.default = 400
    rejecting.start()
    config = tmp / "config.yaml"
    config.write_text(
        CONFIG.format(
            node=NODE,
            state=tmp / "state",
            port=free_port(),
            url=rx.url,
            rejecting=rejecting.url,
            scenario=NVML / scenario,
        )
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("MIGRATION_WEBHOOK_SECRET", SECRET)
    agent = Agent(tmp, host, config)
    try:
        agent.start()
        yield Run(agent, rx, rejecting)
    finally:
        agent.kill()
        rx.stop()
        rejecting.stop()
        mp.undo()


@pytest.fixture(scope="module")
def xid_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from _run(tmp_path_factory.mktemp("xid"), "h100-8gpu-xid79-lost.json")


@pytest.fixture(scope="module")
def throttle_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    yield from _run(tmp_path_factory.mktemp("throttle"), "h100-8gpu-thermal-throttle.json")


def _samples(fams: dict[str, ParsedFamily], name: str) -> list[tuple[dict[str, str], float]]:
    fam = fams.get(name)
    return [] if fam is None else [(dict(labels), value) for labels, value in fam.samples.items()]


def test_xid_event_on_the_webhook_is_the_go_event(xid_run: Run) -> None:
    run = xid_run
    wait_for(lambda: run.events("gpu_xid_error"), "the XID 79 event on the webhook")
    # gpu3 is lost from the next tick: once that ENTER arrived, the XID event had every chance to be followed.
    wait_for(lambda: run.events("gpu_lost"), "gpu_lost for gpu3")
    got = [r for r in run.rx.received if r.data and r.data.get("condition") == "gpu_xid_error"]
    assert len(got) == 1 and got[0].verified
    rec = got[0]
    attrs, data = rec.attributes, rec.data
    assert attrs["type"] == "com.nodevitals.hw.event.v1" and attrs["source"] == f"nodevitals/{NODE}"
    assert attrs["id"] == data["id"] == rec.headers["webhook-id"]
    assert (data["node"], data["tier"], data["device"]) == (NODE, "gpu", "gpu3")
    assert (data["phase"], data["severity"]) == ("ENTER", "critical")  # Go's table: 79 is critical
    assert "ended_at" not in data  # an XID is an ENTER only, with no ended_at
    detail = data["detail"]
    assert detail["xid"] == 79 and isinstance(detail["xid"], int)
    assert isinstance(detail["description"], str) and detail["description"]
    assert [e["phase"] for e in run.events("gpu_xid_error")] == ["ENTER"]  # never an EXIT


def test_xid_is_counted_with_the_go_labels(xid_run: Run) -> None:
    run = xid_run
    wait_for(lambda: run.events("gpu_xid_error"), "the XID 79 event")

    def counted() -> list[tuple[dict[str, str], float]]:
        series = _samples(run.metrics(), "nodevitals_events_total")
        return [(labels, v) for labels, v in series if labels["condition"] == "gpu_xid_error"]

    [(labels, value)] = wait_for(counted, "nodevitals_events_total for the XID")
    assert labels == {
        "node": NODE,
        "tier": "gpu",
        "device": "gpu3",
        "condition": "gpu_xid_error",
        "severity": "critical",
        "phase": "ENTER",
        "xid": "79",
    }
    assert value == 1


def test_delivery_dropped_counts_a_real_drop_under_the_go_sink_label(xid_run: Run) -> None:
    run = xid_run
    sink = f"webhook:http://127.0.0.1:{run.rejecting.port}"  # scheme://host:port; path and ?token= cut

    def dropped() -> float:
        series = _samples(run.metrics(), "nodevitals_delivery_dropped_total")
        return sum(v for labels, v in series if labels["sink"] == sink)

    wait_for(lambda: dropped() >= 1, "a drop counted for the rejecting endpoint")
    with run.rejecting.lock:
        answered = [r for r in run.rejecting.received if r.answered == 400]
    assert answered  # the events really went out and were refused
    fams = run.metrics()
    assert fams["nodevitals_delivery_dropped_total"].type == "counter"
    labels = [labels["sink"] for labels, _ in _samples(fams, "nodevitals_delivery_dropped_total")]
    assert all("token" not in s and "/hooks" not in s for s in labels), labels
    accepted = f"webhook:http://127.0.0.1:{run.rx.port}"
    assert dict((lb["sink"], v) for lb, v in _samples(fams, "nodevitals_delivery_dropped_total"))[accepted] == 0


def test_throttle_active_is_one_per_set_non_benign_reason(throttle_run: Run) -> None:
    run = throttle_run

    def throttled() -> dict[str, ParsedFamily] | None:
        fams = run.metrics()
        series = _samples(fams, "nodevitals_hw_gpu_throttle_active")
        return fams if any(lb["device"] == "gpu5" and v == 1 for lb, v in series) else None

    fams = wait_for(throttled, "gpu5 throttled")
    assert fams["nodevitals_hw_gpu_throttle_active"].type == "gauge"
    series = _samples(fams, "nodevitals_hw_gpu_throttle_active")
    assert all(set(labels) == GPU_LABELS | {"reason"} for labels, _ in series)
    reasons = {labels["reason"] for labels, _ in series}
    assert reasons <= NON_BENIGN and not reasons & BENIGN
    active = {(labels["device"], labels["reason"]) for labels, v in series if v == 1}
    assert active == {("gpu5", "sw_thermal_slowdown"), ("gpu5", "hw_thermal_slowdown"), ("gpu2", "sw_power_cap")}
    # Ours on purpose: an unset non-benign reason is a 0 series (Go emits only the set ones), so a rule exits.
    assert {v for labels, v in series if (labels["device"], labels["reason"]) not in active} == {0.0}
    raw = {labels["device"]: v for labels, v in _samples(fams, "nodevitals_hw_gpu_throttle_reasons")}
    assert (raw["gpu5"], raw["gpu2"], raw["gpu0"]) == (0x60, 0x04, 0)


def test_go_gpu_rule_enters_on_the_hot_gpu(throttle_run: Run) -> None:
    run = throttle_run
    [enter] = wait_for(lambda: run.events("gpu_hot"), "gpu_hot ENTER for gpu5 (3 samples over 85)", timeout=30)
    assert (enter["tier"], enter["device"], enter["phase"], enter["severity"]) == ("gpu", "gpu5", "ENTER", "warning")
    assert enter["detail"]["value"] == pytest.approx(88) and enter["detail"]["threshold"] == pytest.approx(85)
    assert "ended_at" not in enter
    assert not run.events("gpu_ecc_uncorrected")  # no ECC error in this scenario: nothing enters
