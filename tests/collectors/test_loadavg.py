from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.collectors.base import HostRoots, NotPresent, ParseError
from nvdaemon.collectors.loadavg import LoadAvg, LoadAvgCollector, parse_loadavg
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, NOW, collect, damaged, fixture_text, value


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


def test_not_present(tmp_path: Path) -> None:
    with pytest.raises(NotPresent):
        LoadAvgCollector().gather(HostRoots.under(tmp_path))


@pytest.mark.parametrize("text", ["", "0.52 0.61", "0.52 0.61 0.58 2-1024 1", "nan 0.61 0.58 2/1024 1", "a b c d"])
def test_malformed_raises_parse_error(healthy_copy: HostRoots, text: str) -> None:
    (healthy_copy.proc / "loadavg").write_text(text)
    with pytest.raises(ParseError):
        LoadAvgCollector().gather(healthy_copy)


@given(st.text())
def test_parse_any_text(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse_loadavg(text)


@given(damaged(fixture_text("healthy", "proc/loadavg")))
def test_parse_damaged_fixture(text: str) -> None:
    try:
        result = parse_loadavg(text)
    except ParseError:
        return
    assert result.load1 >= 0
