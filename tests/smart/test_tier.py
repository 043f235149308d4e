"""The smart collector under the tier runner: its own time limit, a hung smartctl killed, the next cycle runs."""

from __future__ import annotations

import trio

from nvdaemon.collectors.smart import SmartResult
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.smart.conftest import DISKS, Standin, collector


async def test_runner_waits_for_the_kill_instead_of_abandoning(standin: Standin) -> None:
    standin.modes(sdb="hang")
    c = collector(timeout=1.0)
    runner = CollectorRunner(c, trio.CapacityLimiter(1))
    # collectorTimeoutSeconds (here 0.5 s) is shorter than one smartctl timeout: the collector's own limit applies.
    samples = (await collect_tier("smart", [runner], DISKS, 0.5)).samples
    st = runner.status
    assert not any("read timed out" in e for e in st.errors), st.errors
    assert [e for e in st.errors if e.startswith("sdb: timeout: smartctl killed after 1s")]
    assert {s.device for s in samples} == {"sda", "nvme0n1", "nvme1n1"}
    assert st.detail["unreadable"] == ["sdb"] and st.detail["devices"]["sdb"]["state"] == "timeout"
    standin.modes()
    snap = await collect_tier("smart", [runner], DISKS, 0.5)
    assert runner.status.success and runner.status.errors == ()
    assert {s.device for s in snap.samples} == {"sda", "sdb", "nvme0n1", "nvme1n1"}
    assert isinstance(snap.results["smart"], SmartResult)  # what the smartctl_exporter surface reads
    assert runner.status.as_json()["detail"]["unreadable"] == []


def test_a_reload_that_changes_smart_settings_restarts_only_the_smart_tier() -> None:
    from nvdaemon.app import Agent
    from nvdaemon.configload import parse_config

    def agent(smart: str) -> Agent:
        return Agent(
            parse_config(f"tiers: [core, smart]\nstateDir: /nonexistent\nsmart: {smart}\n", "t.yaml", {}, None)
        )

    a, b = agent("{timeoutSeconds: 30}"), agent("{timeoutSeconds: 5}")
    assert a.tier_fingerprint("smart") != b.tier_fingerprint("smart")
    assert a.tier_fingerprint("core") == b.tier_fingerprint("core")
    assert a.interval("smart") == 300 and a.active_tiers() == ["core", "smart"]
