from __future__ import annotations

from nvdaemon.collectors.loadavg import LoadAvg, LoadAvgCollector, parse_loadavg
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, NOW, collect, value


def test_healthy() -> None:
    gathered, samples = collect(LoadAvgCollector(), HEALTHY)
    assert gathered.errors == []
    assert value(samples, "load1", "cpu") == 0.52
    assert value(samples, "load5", "cpu") == 0.61
    assert value(samples, "load15", "cpu") == 0.58
    assert value(samples, "procs_running", "cpu") == 2
    assert value(samples, "procs_existing", "cpu") == 1024
    assert all(s.kind is Kind.GAUGE and s.timestamp == NOW for s in samples)
    assert len(samples) == 5


def test_faulty_is_overloaded() -> None:
    _, samples = collect(LoadAvgCollector(), FAULTY)
    assert value(samples, "load1", "cpu") == 24.51
    assert value(samples, "procs_running", "cpu") == 27


def test_parse_exact() -> None:
    assert parse_loadavg("1.00 2.50 3.25 4/567 8910\n") == LoadAvg(1.0, 2.5, 3.25, 4, 567)
