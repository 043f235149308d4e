"""End to end: ``nvdaemon run`` with ``tiers: [core, smart]`` on a fixture host whose dev/ holds the fixture disks,
smartctl being the stand-in, the default rules of examples/smart.yaml and smartctlCompat on. sda is made
unreadable (permission denied, as in an unprivileged pod)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.smart.conftest import ROOT, STANDIN
from tests.smart.test_compat import UPSTREAM_LINT
from tests.smart.test_rules import EXAMPLE, FIRING
from tests.test_e2e import GRACE, Agent, free_port, wait_for

# The Go agent's names and types (every smart-tier series a gauge), which promtool's lint would name otherwise.
# Nothing else may be reported.
OUR_LINT = {
    'nodevitals_hw_smart_power_on_hours use base unit "seconds" instead of "hours"',
    'nodevitals_hw_smart_interface_speed_bits_per_second use base unit "bytes" instead of "bits"',
    'nodevitals_hw_smart_error_log_count non-histogram and non-summary metrics should not have "_count" suffix',
    'nodevitals_hw_nvme_bytes_read_total non-counter metrics should not have "_total" suffix',
    'nodevitals_hw_nvme_bytes_written_total non-counter metrics should not have "_total" suffix',
}


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Agent]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    for node in (ROOT / "fixtures" / "hosts" / "disks" / "dev").iterdir():
        shutil.copy(node, host / "dev" / node.name)
    rules = yaml.safe_load(EXAMPLE.read_text())["rules"]
    config: dict[str, Any] = {
        "node": "fixture-node",
        "tiers": ["core", "smart"],
        "intervalSeconds": 0.5,
        "stateDir": str(tmp_path / "state"),
        "shutdownGraceSeconds": GRACE,
        "smart": {"smartctlPath": str(STANDIN), "intervalSeconds": 0.4, "timeoutSeconds": 5},
        "smartctlCompat": {"enabled": True},
        "sinks": {"metrics": {"listenAddr": f"127.0.0.1:{free_port()}"}},
        "rules": rules,
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML, and keeps the address quoted for Agent
    monkeypatch.setenv("SMARTCTL_STANDIN_MODE", "sda=denied")
    a = Agent(tmp_path, host, path)
    yield a
    a.kill()


def test_smart_tier_end_to_end(agent: Agent, tmp_path: Path) -> None:
    agent.start()
    active = wait_for(
        lambda: (
            {(c["device"], c["condition"], c["severity"]) for c in agent.status()["conditions"]} >= FIRING
            and agent.status()["conditions"]
        ),
        "the default SMART rules to ENTER",
    )
    assert {(c["device"], c["condition"], c["severity"]) for c in active} - FIRING == set()
    state = agent.status()
    smart = state["tiers"]["smart"]
    assert smart["intervalSeconds"] == 0.4
    detail = smart["collectors"]["smart"]["detail"]
    assert detail["unreadable"] == ["sda"] and "Permission denied" in detail["devices"]["sda"]["reason"]
    status, body = agent.get("/metrics")
    assert status == 200
    text = body.decode()
    assert 'nodevitals_smart_device_readable{device="sda"} 0.0' in text
    assert 'nodevitals_smart_device_readable{device="sdb"} 1.0' in text
    assert 'nodevitals_hw_smart_pending_sectors{device="sdb",node="fixture-node",tier="smart"} 24.0' in text
    assert "# TYPE nodevitals_hw_smart_power_on_hours gauge" in text  # the Go agent's name: no _total appended
    assert (
        'nodevitals_hw_smart_device_info{device="sdb",firmware="0001",model="ST4000DM004-2CV104",'
        'node="fixture-node",serial="ZFN0ABCD",tier="smart"} 1.0'
    ) in text
    assert 'nodevitals_hw_nvme_critical_warning{device="nvme1n1"' in text
    assert 'nodevitals_hw_smart_device_info{device="sda"' not in text  # nothing made up for the unreadable disk
    assert not re.search(r'^nodevitals_hw_\w+\{device="sda",node="fixture-node",tier="smart"', text, re.M)
    assert "# TYPE smartctl_device_power_on_seconds counter" in text
    assert 'smartctl_device_smart_status{device="nvme1"} 0\n' in text
    # Several smart cycles later the unreadable disk has been logged exactly once.
    wait_for(lambda: agent.status()["tiers"]["smart"]["collectors"]["smart"]["errorTotal"] >= 4, "4 smart cycles")
    log = (tmp_path / "agent.log").read_text()
    assert log.count("SMART: sda is unreadable") == 1, log
    promtool = shutil.which("promtool")
    if promtool is not None:
        check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, check=False)
        findings = (check.stdout + check.stderr).decode().splitlines()
        assert [f for f in findings if not UPSTREAM_LINT.match(f) and f not in OUR_LINT] == [], "\n".join(findings)
    code, took = agent.stop()
    assert code == 0 and took < GRACE
    if promtool is None:
        pytest.skip(
            "promtool not installed (Debian package prometheus; make test installs it as root): exposition unchecked"
        )
