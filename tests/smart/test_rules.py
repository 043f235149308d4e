"""The default SMART rules (examples/smart.yaml) fire on the failing fixture disks, and only there."""

from __future__ import annotations

import itertools

from nvdaemon import engine
from nvdaemon.configload import load_config
from nvdaemon.model import Phase
from tests.smart.conftest import NOW, ROOT, Standin, collector, cycle

EXAMPLE = ROOT / "examples" / "smart.yaml"
FIRING = {
    ("sdb", "disk_pending_sectors", "critical"),
    ("sdb", "disk_reallocated_sectors", "warning"),
    ("sdb", "disk_offline_uncorrectable", "critical"),
    ("nvme1n1", "nvme_wear_high", "warning"),
    ("nvme1n1", "nvme_critical_warning", "critical"),
    ("nvme1n1", "disk_health_failed", "critical"),
}


def test_default_rules_enter_on_the_failing_disks(standin: Standin) -> None:
    loaded = load_config(str(EXAMPLE), env={}, host_root=ROOT / "fixtures" / "hosts" / "disks")
    assert loaded.tiers == ("core", "smart")
    rules = engine.compile_rules(loaded.config.rules)
    state = engine.EngineState()
    ids = (f"id-{n}" for n in itertools.count())
    _, samples = cycle(collector())
    events = engine.evaluate(state, rules, samples, tier="smart", node="n", now=NOW, new_id=lambda _now: next(ids))
    assert {(e.device, e.condition, e.severity) for e in events} == FIRING
    assert all(e.phase is Phase.ENTER and e.tier == "smart" for e in events)
    # Held conditions do not repeat; the healthy SSD and NVMe never enter anything.
    again = engine.evaluate(state, rules, samples, tier="smart", node="n", now=NOW + 300, new_id=lambda _now: next(ids))
    assert again == []
