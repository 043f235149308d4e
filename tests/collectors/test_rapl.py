from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nvdaemon.collectors.base import HostRoots, read_text
from nvdaemon.collectors.rapl import PERMISSION_MESSAGE, RaplCollector, parse_energy
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, collect, find, value


def deny(*zones: str) -> RaplCollector:
    """A collector whose reader fails like a non-root read of energy_uj (root can read a mode-000 file)."""

    def read(where: str) -> str:
        path = Path(where)
        if path.name == "energy_uj" and (not zones or path.parent.name in zones):
            raise PermissionError(13, "Permission denied", str(path))
        return read_text(path)

    return RaplCollector(read=read)


def test_healthy_nested_layout_counts_each_zone_once() -> None:
    assert (HEALTHY.sys / "class" / "powercap" / "intel-rapl:0").is_symlink()
    gathered, samples = collect(RaplCollector(), HEALTHY)
    assert gathered.errors == []
    assert [(s.device, dict(s.labels)["zone"]) for s in samples] == [
        ("intel-rapl:0", "package-0"),
        ("intel-rapl:0:0", "core"),
        ("intel-rapl:0:1", "dram"),
    ]
    pkg = find(samples, "power_energy_joules_total", "intel-rapl:0", zone="package-0")
    assert pkg.value == pytest.approx(123456.789012)
    assert pkg.kind is Kind.COUNTER
    assert value(samples, "power_energy_joules_total", "intel-rapl:0:1", zone="dram") == pytest.approx(12345.678901)


def test_faulty_flat_layout() -> None:
    _, samples = collect(RaplCollector(), FAULTY)
    assert len(samples) == 3
    assert value(samples, "power_energy_joules_total", "intel-rapl:0", zone="package-0") == pytest.approx(187654.321098)


def test_permission_denied_is_reported_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    collector = deny()
    caplog.set_level(logging.WARNING, logger="nvdaemon.collectors.rapl")
    for _ in range(2):
        gathered, samples = collect(collector, HEALTHY)
        assert gathered.errors == [PERMISSION_MESSAGE]  # one stable entry, not one per zone
        assert samples == []
        assert collector.permission_denied
    denials = [r for r in caplog.records if "permission denied" in r.getMessage()]
    assert len(denials) == 1
    assert denials[0].levelno == logging.WARNING


def test_permission_denied_on_one_zone_keeps_the_others() -> None:
    gathered, samples = collect(deny("intel-rapl:0:1"), FAULTY)
    assert gathered.errors == [PERMISSION_MESSAGE]
    assert [s.device for s in samples] == ["intel-rapl:0", "intel-rapl:0:0"]


def test_permission_flag_clears_when_readable_again() -> None:
    denied = {"on": True}

    def read(path: str) -> str:
        if denied["on"] and Path(path).name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return read_text(path)

    collector = RaplCollector(read=read)
    collector.gather(HEALTHY)
    assert collector.permission_denied
    denied["on"] = False
    assert len(collector.interpret(collector.gather(HEALTHY), 1.0).samples) == 3
    assert not collector.permission_denied


def test_malformed_zone_keeps_the_others(faulty_copy: HostRoots) -> None:
    (faulty_copy.sys / "class" / "powercap" / "intel-rapl:0:0" / "energy_uj").write_text("12ab\n")
    gathered, samples = collect(RaplCollector(), faulty_copy)
    assert len(gathered.errors) == 1 and "intel-rapl:0:0" in gathered.errors[0]
    assert [s.device for s in samples] == ["intel-rapl:0", "intel-rapl:0:1"]


def test_a_zone_without_a_readable_name_keeps_its_energy(faulty_copy: HostRoots) -> None:
    """Go emits such a zone without the zone label; ours has zone="" (the same series in Prometheus)."""
    (faulty_copy.sys / "class" / "powercap" / "intel-rapl:0:0" / "name").unlink()
    gathered, samples = collect(RaplCollector(), faulty_copy)
    assert gathered.errors == []  # a missing name file is no error, as in Go
    assert find(samples, "power_energy_joules_total", "intel-rapl:0:0", zone="").kind is Kind.COUNTER
    assert len(samples) == 3

    def unreadable_name(where: str) -> str:
        path = Path(where)
        if path.name == "name" and path.parent.name == "intel-rapl:0:1":
            raise OSError(5, "Input/output error", str(path))
        return read_text(path)

    gathered, samples = collect(RaplCollector(read=unreadable_name), faulty_copy)
    assert len(gathered.errors) == 1 and "intel-rapl:0:1/name" in gathered.errors[0]
    assert value(samples, "power_energy_joules_total", "intel-rapl:0:1", zone="") > 0


def test_parse_energy() -> None:
    assert parse_energy("123456789012\n") == 123456789012
