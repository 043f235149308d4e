"""End to end: ``nvdaemon run`` on a copy of the faulty fixture host, with a webhook receiver that is down.

The agent spools the events, is killed with SIGKILL, and the receiver comes up; restarted on the same stateDir the
agent delivers the whole backlog, in order, each request verified by ``standardwebhooks`` and parsed by the
``cloudevents`` SDK. ``nvdaemon spool list`` shows the backlog between the two runs. Every body is the Go agent's
(nodevitals-contract.md §3): the attributes without ``subject``, ``data`` with RFC 3339 times and ``ended_at`` only
on the EXIT; the self metrics carry the Go label sets.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from nvdaemon import cli

from ..test_e2e import ROOT, Agent, free_port, wait_for
from .helpers import SECRET
from .receiver import Received, Receiver

GO_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
DATA_KEYS = ["id", "node", "tier", "device", "condition", "phase", "severity", "seq", "started_at", "detail"]

CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: 5
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  webhook:
    - url: {url}
      secret: ${{E2E_WEBHOOK_SECRET}}
      backoffBaseSeconds: 0.1
      backoffMaxSeconds: 0.3
rules:
  - {{metric: load1, device: cpu, condition: load_high, threshold: 16, enterFor: 2, exitFor: 2}}
  - {{metric: temp_celsius, device: hwmon0/coretemp/temp1, condition: cpu_package_hot,
     severity: critical, threshold: 95, op: ">="}}
  - {{metric: psi_stall_ratio_avg10, device: memory, labels: {{share: some}}, condition: memory_pressure,
     threshold: 20}}
  - {{metric: pcie_aer_fatal_total, labels: {{error_type: TOTAL_ERR_FATAL}}, device: "0000:*",
     condition: pcie_aer_fatal, severity: critical, threshold: 0}}
"""


@pytest.mark.e2e
def test_sigkill_with_a_backlog_then_restart_delivers_everything_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("E2E_WEBHOOK_SECRET", SECRET)
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    rx = Receiver(secret=SECRET)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", port=free_port(), url=rx.url))
    sink = f"webhook:127.0.0.1:{rx.port}"
    agent = Agent(tmp_path, host, config)
    try:
        agent.start()

        def spooled() -> list[str] | None:
            state = agent.status()
            ids = [e["id"] for e in state["recentEvents"]]
            s = state["sinks"].get(sink, {})
            ok = len(ids) >= 4 and s.get("backlog") == len(ids) and s.get("lastError", "").startswith("ConnectError")
            return ids if ok else None

        wait_for(spooled, "events spooled while the receiver is down")
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait(timeout=10)

        assert cli.main(["spool", "list", "--config", str(config)]) == 0
        listing = capsys.readouterr().out
        pending = [line.split()[0] for line in listing.splitlines()[1:] if " pending " in line]
        assert len(pending) >= 4 and f"{len(pending)} pending, 0 dead" in listing

        rx.start()
        agent.start()
        wait_for(lambda: set(pending) <= set(rx.ids()), "the backlog delivered after the restart", timeout=30)
        wait_for(lambda: agent.status()["sinks"][sink]["backlog"] == 0, "backlog 0")
        # The load falls: load_high EXITs (exitFor 2), delivered live.
        (host / "proc" / "loadavg").write_text("0.50 0.40 0.30 2/1310 223344\n")
        wait_for(lambda: any(r.data and r.data["phase"] == "EXIT" for r in rx.received), "load_high EXIT delivered")
        # The receiver records the EXIT before the agent has its 2xx and takes it off the spool.
        wait_for(lambda: agent.status()["sinks"][sink]["backlog"] == 0, "backlog 0 after the EXIT")
        status, body = agent.get("/metrics")
        assert status == 200
        text = body.decode()
        assert f'nodevitals_delivery_dropped_total{{sink="webhook:http://127.0.0.1:{rx.port}"}} 0.0' in text
        assert (
            'nodevitals_events_total{condition="load_high",device="cpu",node="fixture-node",phase="EXIT",'
            'severity="warning",tier="core",xid=""} 1.0'
        ) in text
        assert f'nodevitals_delivery_backlog{{sink="{sink}"}} 0.0' in text
        assert f'nodevitals_delivery_attempts_total{{outcome="success",sink="{sink}"}}' in text
        assert "/hooks/hw" not in text and "do-not-show" not in text
        promtool = shutil.which("promtool")
        if promtool is not None:
            check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, check=False)
            assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
        code, _ = agent.stop()
        assert code == 0
    finally:
        rx.stop()
        agent.kill()
    arrived = list(dict.fromkeys(rx.ids()))
    assert arrived[: len(pending)] == pending  # the backlog first, in spool order
    seqs = list(dict.fromkeys(rx.seqs()))
    assert seqs == sorted(seqs)  # in emission order
    for r in rx.received:
        check_go_payload(r)
    load = [r.data for r in rx.received if r.data["condition"] == "load_high"]
    enter, exit_ = load[0], load[-1]
    assert (enter["phase"], exit_["phase"]) == ("ENTER", "EXIT")
    assert exit_["started_at"] == enter["started_at"]  # the ENTER's time, carried on the EXIT
    assert time_of(exit_["ended_at"]) > time_of(enter["started_at"])
    assert os.stat(tmp_path / "state" / "spool.db").st_mode & 0o077 == 0


def time_of(text: str) -> dt.datetime:
    assert GO_RFC3339.match(text) and text.endswith("Z"), text
    return dt.datetime.fromisoformat(text)


def check_go_payload(r: Received) -> None:
    """One delivery as a receiver written for the Go agent reads it: headers, attributes and ``data``."""
    assert r.verified  # standardwebhooks accepted webhook-id, webhook-timestamp and webhook-signature
    assert r.headers["content-type"] == "application/cloudevents+json"
    assert r.headers["webhook-id"] == r.event_id == r.data["id"]
    assert r.headers["webhook-timestamp"].isdigit() and r.headers["webhook-signature"].startswith("v1,")
    attrs: dict[str, Any] = r.attributes
    assert set(attrs) == {"specversion", "type", "source", "id", "time", "datacontenttype"}  # no subject
    assert (attrs["specversion"], attrs["type"]) == ("1.0", "com.nodevitals.hw.event.v1")
    assert (attrs["source"], attrs["datacontenttype"]) == ("nodevitals/fixture-node", "application/json")
    data = r.data
    ended = ["ended_at"] if data["phase"] == "EXIT" else []  # absent on ENTER, not null
    assert list(data) == DATA_KEYS[:-1] + ended + ["detail"]
    assert data["node"] == "fixture-node" and data["tier"] == "core" and isinstance(data["seq"], int)
    assert data["severity"] in ("info", "warning", "critical")
    stamp = data["ended_at"] if ended else data["started_at"]
    assert attrs["time"] == time_of(stamp)  # the envelope's time is the transition's
    assert time_of(data["started_at"]).tzinfo == dt.UTC
    assert isinstance(data["detail"]["value"], float) and isinstance(data["detail"]["threshold"], float)
