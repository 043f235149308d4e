from __future__ import annotations

import pytest

from nvdaemon.catalogue import HELP
from nvdaemon.collectors import COLLECTORS, collectors_for_tier
from nvdaemon.collectors.base import HostRoots
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, NOW, collect

NAMES = ["loadavg", "cpu", "memory", "netdev", "diskstats", "hwmon", "pressure", "rapl", "pcie_aer"]


def test_table_lists_all_nine_in_order() -> None:
    assert [spec.name for spec in COLLECTORS if spec.tier == "core"] == NAMES
    for spec in [s for s in COLLECTORS if s.tier == "core"]:
        assert spec.default_enabled
        assert spec.description
        instance = spec.factory()
        assert instance.name == spec.name
        assert instance.tier == "core"


def test_collectors_for_tier_gives_fresh_instances() -> None:
    first = collectors_for_tier("core")
    second = collectors_for_tier("core")
    assert [c.name for c in first] == NAMES
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert [c.name for c in collectors_for_tier("gpu")] == ["nvml"]  # bound to NVML by nvdaemon/gpu


@pytest.mark.parametrize("roots", [HEALTHY, FAULTY], ids=["healthy", "faulty"])
def test_every_collector_runs_clean_on_fixture_hosts(roots: HostRoots) -> None:
    for collector in collectors_for_tier("core"):
        gathered, samples = collect(collector, roots)
        assert gathered.errors == [], collector.name
        assert samples, collector.name
        for s in samples:
            assert s.tier == "core"
            assert s.timestamp == NOW
            # Counters and only counters end in _total; no gauge borrows a histogram/summary suffix (promtool rules).
            assert (s.kind is Kind.COUNTER) == s.metric.endswith("_total"), s.metric
            assert not s.metric.endswith(("_count", "_sum", "_bucket")), s.metric
            assert s.metric in HELP, f"{s.metric} has no HELP text in nvdaemon/catalogue.py"
            assert s.labels == tuple(sorted(s.labels))
