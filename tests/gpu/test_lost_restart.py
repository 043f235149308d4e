"""A lost GPU across restarts of the agent: ``nvdaemon run`` as a subprocess on the fake NVML, three times on the
same stateDir with gpu5 lost (``h100-8gpu-gpu5-lost-no-xid``), then once with it answering again (the healthy
scenario, as after a reboot), all delivering to a real webhook receiver on loopback.

The receiver must get exactly one ``gpu_lost`` ENTER for gpu5 and one EXIT that pairs with it (same device, same
start, same GPU), each event seq once: a restart neither repeats an ENTER nor loses an EXIT, for lost GPUs too.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.conftest import HEALTHY, SCENARIOS
from tests.sinks.helpers import SECRET
from tests.sinks.receiver import Receiver
from tests.test_e2e import ROOT, Agent, free_port, wait_for

pytestmark = pytest.mark.e2e

LOST = SCENARIOS / "h100-8gpu-gpu5-lost-no-xid.json"
UUID5 = "GPU-5a8b9d76-c2a7-4e5f-8b6d-0f1a2b3c4d56"
CONFIG = """
node: fixture-node
tiers: [gpu]
intervalSeconds: 0.2
stateDir: {state}
shutdownGraceSeconds: 5
gpu: {{backend: fake, fakeScenario: "{scenario}", xid: false}}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  stream: {{enabled: false}}
  webhook:
    - {{url: "{url}", secret: "{secret}", backoffBaseSeconds: 0.05, backoffMaxSeconds: 0.2}}
rules: []
"""
EVENT_LINE = re.compile(r"nvdaemon\.events: event (ENTER|EXIT) (\S+) .* seq=(\d+) id=(\S+)")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Agent, Receiver]]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "healthy", host, symlinks=True)
    rx = Receiver(secret=SECRET).start()
    config = tmp_path / "config.yaml"
    config.write_text(
        CONFIG.format(state=tmp_path / "state", scenario=LOST, port=free_port(), url=rx.url, secret=SECRET)
    )
    agent = Agent(tmp_path, host, config)
    try:
        yield agent, rx
    finally:
        agent.kill()
        rx.stop()


def logged(agent: Agent) -> list[tuple[str, str, int, str]]:
    """(phase, condition, seq, id) of every event the agent logged, across its runs (one log file)."""
    agent.log.flush()
    text = Path(str(agent.log.name)).read_text()
    return [(m[1], m[2], int(m[3]), m[4]) for m in EVENT_LINE.finditer(text)]


def lost_gpu5(rx: Receiver) -> list[dict[str, Any]]:
    with rx.lock:
        data = [r.data for r in rx.received if isinstance(r.data, dict)]
    return [d for d in data if d["condition"] == "gpu_lost" and d["device"] == "gpu5"]


def test_three_restarts_with_gpu5_lost_then_healthy_send_one_enter_and_its_exit(
    setup: tuple[Agent, Receiver],
) -> None:
    agent, rx = setup
    agent.start()
    wait_for(lambda: lost_gpu5(rx), "the gpu_lost ENTER of gpu5 at the receiver")
    agent.wait_ticks(2, "gpu")
    assert agent.stop()[0] == 0

    for _ in (2, 3):  # gpu5 is still lost: seen lost on every tick, nothing to send
        agent.start()
        agent.wait_ticks(3, "gpu")  # the first tick finds gpu5 lost; the later ones would repeat nothing
        assert agent.stop()[0] == 0
        # Still lost: neither a second ENTER nor an early EXIT in this run.
        assert [p for p, c, _, _ in logged(agent) if c == "gpu_lost"] == ["ENTER"]

    # The node rebooted and gpu5 answers again.
    agent.config.write_text(agent.config.read_text().replace(str(LOST), str(HEALTHY)))
    agent.start()
    agent.wait_ticks(3, "gpu")
    # Everything the four runs logged reaches the receiver (the spool keeps what a stop left undelivered).
    ids = {i for _, _, _, i in logged(agent)}
    wait_for(lambda: ids <= set(rx.ids()), lambda: f"every logged event at the receiver: {logged(agent)}")
    assert agent.stop()[0] == 0

    log = Path(str(agent.log.name)).read_text()
    assert [p for p, c, _, _ in logged(agent) if c == "gpu_lost"] == ["ENTER", "EXIT"]
    assert "restored 1 active condition(s) (0 rule, 1 lost GPU)" in log
    enter, exit_ = lost_gpu5(rx)
    assert (enter["phase"], exit_["phase"]) == ("ENTER", "EXIT")
    assert exit_["started_at"] == enter["started_at"] and "ended_at" in exit_
    assert enter["detail"]["gpu_uuid"] == exit_["detail"]["gpu_uuid"] == UUID5
    # One event per seq across the restarts (a redelivery of one event, at least once, repeats its id and seq).
    with rx.lock:
        pairs = {(int(r.data["seq"]), r.event_id) for r in rx.received if isinstance(r.data, dict)}
    assert len({seq for seq, _ in pairs}) == len(pairs), sorted(pairs)
