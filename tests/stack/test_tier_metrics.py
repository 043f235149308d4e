"""nodevitals_tier_last_tick_timestamp_seconds / nodevitals_tier_interval_seconds: what NvdaemonTierStuck keys on."""

from __future__ import annotations

from nvdaemon.model import TierSnapshot
from nvdaemon.server.tier_metrics import tier_self_metrics


def test_last_tick_is_the_end_of_the_latest_snapshot_and_interval_per_tier() -> None:
    snaps = {
        "smart": TierSnapshot("smart", [], {}, collected_at=1_700_000_000.0, duration=2.5),
        "core": TierSnapshot("core", [], {}, collected_at=1_700_000_100.0, duration=0.25),
    }
    families = {f.name: f for f in tier_self_metrics(snaps, lambda tier: {"core": 15.0, "smart": 300.0}[tier])}
    last = {s.labels["tier"]: s.value for s in families["nodevitals_tier_last_tick_timestamp_seconds"].samples}
    interval = {s.labels["tier"]: s.value for s in families["nodevitals_tier_interval_seconds"].samples}
    assert last == {"core": 1_700_000_100.25, "smart": 1_700_000_002.5}
    assert interval == {"core": 15.0, "smart": 300.0}


def test_no_tier_no_series() -> None:
    assert [f.samples for f in tier_self_metrics({}, lambda tier: 1.0)] == [[], []]
