"""The kernel-log source in the agent: ``nvdaemon run`` as a subprocess over a host root holding the fixture host
``fixtures/hosts/kmsg`` (its ``dev/kmsg``, ``proc/uptime`` and boot id, over ``fixtures/hosts/healthy`` for the core
tier), delivering to a real webhook receiver on loopback.

The first run raises the events of every fixture record, reports ``nodevitals_kmsg_up 1`` and the matches per rule on
``/metrics`` and the source's state in ``/v1/status``; after SIGTERM an XID of another GPU is appended to the log, and
the second run on the same stateDir raises that one only: no event of the first run again.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdaemon.kmsg.record import record_line
from tests.sinks.helpers import SECRET
from tests.sinks.receiver import Receiver
from tests.test_e2e import ROOT, Agent, free_port, wait_for

pytestmark = pytest.mark.e2e

CONFIG = """
node: kmsg-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: 5
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  stream: {{enabled: false}}
  webhook:
    - {{url: "{url}", secret: "{secret}", backoffBaseSeconds: 0.05, backoffMaxSeconds: 0.2}}
rules: []
"""
# (condition, device, phase) of what the fixture log raises: 17 ENTERs, and the EXIT of nvme_timeout, whose three
# timeouts were logged 2500 s before the fixture's uptime (longer ago than the rule's clearAfterSeconds).
FIRST_RUN = Counter(
    {
        ("gpu_xid_error", "0000:3b:00", "ENTER"): 2,
        ("gpu_xid_error", "0018:01:00", "ENTER"): 1,
        ("gpu_fallen_off", "0000:3b:00.0", "ENTER"): 1,
        ("nvswitch_sxid_error", "nvswitch0", "ENTER"): 1,
        ("kernel_oom_kill", "kernel", "ENTER"): 1,
        ("kernel_task_hung", "kernel", "ENTER"): 1,
        ("filesystem_error", "nvme0n1p2", "ENTER"): 1,
        ("filesystem_read_only", "kernel", "ENTER"): 1,
        ("block_io_error", "sdb1", "ENTER"): 1,
        ("nvme_timeout", "nvme1", "ENTER"): 1,
        ("nvme_timeout", "nvme1", "EXIT"): 1,
        ("nvme_reset", "nvme1", "ENTER"): 1,
        ("machine_check", "kernel", "ENTER"): 1,
        ("machine_check_exception", "2", "ENTER"): 1,
        ("memory_read_error", "CPU_SrcID#0_MC#0_Chan#1_DIMM#0", "ENTER"): 1,
        ("hardware_error_cper_fatal", "kernel", "ENTER"): 1,
    }
)
FIXTURE_RECORDS = 21
NEW_XID = "NVRM: Xid (PCI:0000:5d:00): 48, pid=777, name=trainer, An uncorrectable double bit error"


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Agent, Receiver]]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "healthy", host, symlinks=True)
    shutil.copytree(ROOT / "fixtures" / "hosts" / "kmsg", host, dirs_exist_ok=True)
    rx = Receiver(secret=SECRET).start()
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", port=free_port(), url=rx.url, secret=SECRET))
    agent = Agent(tmp_path, host, config)
    try:
        yield agent, rx
    finally:
        agent.kill()
        rx.stop()


def delivered(rx: Receiver) -> dict[str, dict[str, Any]]:
    """Every event the receiver got, by id (a redelivery, at least once, repeats an id: counted once)."""
    with rx.lock:
        return {r.event_id: r.data for r in rx.received if r.event_id is not None and isinstance(r.data, dict)}


def tally(events: dict[str, dict[str, Any]]) -> Counter[tuple[str, str, str]]:
    return Counter((d["condition"], d["device"], d["phase"]) for d in events.values())


def metric(text: str, name: str, labels: str = "") -> float | None:
    """The value of one series in an exposition (``labels`` a substring of its label set), None when absent."""
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", line)
        if m is not None and labels in (m.group(1) or ""):
            return float(m.group(2))
    return None


def test_agent_raises_the_kernel_log_once_across_a_restart(setup: tuple[Agent, Receiver]) -> None:
    agent, rx = setup
    agent.start()
    wait_for(lambda: tally(delivered(rx)) == FIRST_RUN, lambda: f"the fixture's events; got {tally(delivered(rx))}")
    kernel_log = agent.status()["kernelLog"]
    assert kernel_log["up"] is True and kernel_log["recordsRead"] == FIXTURE_RECORDS
    status, body = agent.get("/metrics")
    assert status == 200
    text = body.decode()
    assert metric(text, "nodevitals_kmsg_up") == 1.0
    assert metric(text, "nodevitals_kmsg_matches_total", 'rule="xid"') == 3.0
    assert metric(text, "nodevitals_kmsg_records_read_total") == FIXTURE_RECORDS
    xid = next(d for d in delivered(rx).values() if d["condition"] == "gpu_xid_error" and d["detail"]["xid"] == 79)
    assert xid["detail"]["sources"] == ["kmsg"]
    assert agent.stop()[0] == 0
    first = delivered(rx)

    # Logged while the agent was down, in the same boot: the next record after the last one read.
    with (agent.host / "dev" / "kmsg").open("ab") as f:
        f.write(record_line(4, 1222, 3_000_000_000, NEW_XID))
    agent.start()
    new = ("gpu_xid_error", "0000:5d:00", "ENTER")
    wait_for(lambda: new in tally(delivered(rx)), lambda: f"the new XID; got {tally(delivered(rx))}")
    kernel_log = agent.status()["kernelLog"]
    assert kernel_log["skipped"].get("seen") == FIXTURE_RECORDS and kernel_log["recordsRead"] == FIXTURE_RECORDS + 1
    assert agent.stop()[0] == 0
    both = delivered(rx)
    # Webhook delivery is in seq order: once the new XID arrived, any repeat read before it would have arrived too.
    assert tally(both) == FIRST_RUN + Counter([new])
    (added,) = [d for i, d in both.items() if i not in first]
    assert added["detail"]["xid"] == 48 and added["seq"] > max(d["seq"] for d in first.values())
