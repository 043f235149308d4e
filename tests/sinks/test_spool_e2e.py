"""End to end, ``nvdaemon run`` on a copy of the faulty fixture host: a damaged ``spool.db`` is moved aside and
delivery goes on; a stateDir full to the last byte (a tmpfs with a ballast file, root only) shows as a degraded sink
in the status document and /metrics, without a crash loop, and once space is freed every event arrives."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from ..test_e2e import ROOT, Agent, free_port, wait_for
from .helpers import SECRET
from .receiver import Receiver
from .storage import fill, tmpfs

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
"""


def setup(tmp_path: Path, state: Path, rx: Receiver) -> tuple[Agent, str]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=state, port=free_port(), url=rx.url))
    return Agent(tmp_path, host, config), f"webhook:127.0.0.1:{rx.port}"


@pytest.mark.e2e
def test_a_running_agent_moves_a_damaged_spool_aside_and_delivers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2E_WEBHOOK_SECRET", SECRET)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "spool.db").write_bytes(os.urandom(16384))
    with Receiver(secret=SECRET) as rx:
        agent, sink = setup(tmp_path, state, rx)
        try:
            agent.start()
            wait_for(lambda: len(rx.ids()) >= 1, "an event delivered on a fresh spool")
            doc = agent.status()
            (record,) = doc["sinks"][sink]["quarantines"]
            assert record["events"] == "unknown" and doc["tasks"][sink]["restarts"] == 0
            _, body = agent.get("/metrics")
            assert f'nodevitals_webhook_spool_quarantines_total{{held="unknown",sink="{sink}"}} 1.0' in body.decode()
            assert agent.stop()[0] == 0
        finally:
            agent.kill()
    assert [p.name for p in state.iterdir() if p.name.startswith("spool.db.corrupt-")]


@pytest.mark.e2e
def test_a_running_agent_with_a_full_state_dir_is_degraded_then_delivers_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("E2E_WEBHOOK_SECRET", SECRET)
    rx = Receiver(secret=SECRET)  # down at first
    with tmpfs(tmp_path / "state", "1m") as state:
        ballast = fill(state)
        agent, sink = setup(tmp_path, state, rx)
        try:
            agent.start()

            def degraded() -> dict[str, Any] | None:
                doc = agent.status()
                s = doc["sinks"].get(sink, {})
                ok = s.get("state") == "degraded" and s.get("unspooled", 0) >= 1 and len(doc["recentEvents"]) >= 1
                return doc if ok else None

            doc = wait_for(degraded, "events held in memory while the stateDir is full")
            task = doc["tasks"][sink]
            assert task["state"] == "running" and task["restarts"] == 0 and "spool not writable" in task["lastError"]
            _, body = agent.get("/metrics")
            assert f'nodevitals_sink_state_writable{{sink="{sink}"}} 0.0' in body.decode()
            assert agent.get("/healthz")[0] == 200
            assert not (state / "engine.json").exists()  # never saved past events the spool does not hold
            ballast.unlink()
            rx.start()
            emitted = {e["id"] for e in agent.status()["recentEvents"]}
            wait_for(lambda: emitted <= set(rx.ids()), "every event delivered once space is freed", timeout=30)
            wait_for(lambda: agent.status()["sinks"][sink]["state"] == "active", "the sink active again")
            _, body = agent.get("/metrics")
            assert f'nodevitals_sink_state_writable{{sink="{sink}"}} 1.0' in body.decode()
            assert agent.stop()[0] == 0
        finally:
            agent.kill()
            rx.stop()
    assert all(r.verified for r in rx.received)
