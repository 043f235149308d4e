"""End to end: ``nvdaemon run`` on a copy of the faulty fixture host, with a webhook receiver that is down.

The agent spools the events, is killed with SIGKILL, and the receiver comes up; restarted on the same stateDir the
agent delivers the whole backlog, in order, each request verified by ``standardwebhooks`` and parsed by the
``cloudevents`` SDK. ``nvdaemon spool list`` shows the backlog between the two runs.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from nvdaemon import cli

from ..test_e2e import ROOT, Agent, free_port, wait_for
from .helpers import SECRET
from .receiver import Receiver

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
  - {{metric: temp_celsius, device: coretemp, labels: {{sensor: Package id 0}}, condition: cpu_package_hot,
     severity: critical, threshold: 95, op: ">="}}
  - {{metric: psi_avg10_pct, device: memory, labels: {{kind: some}}, condition: memory_pressure, threshold: 20}}
  - {{metric: pcie_aer_fatal_total, device: "0000:*", condition: pcie_aer_fatal, severity: critical, threshold: 0}}
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
        status, body = agent.get("/metrics")
        assert status == 200
        text = body.decode()
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
    assert all(r.verified and r.attributes["source"] == "nodevitals/fixture-node" for r in rx.received)
    assert os.stat(tmp_path / "state" / "spool.db").st_mode & 0o077 == 0
