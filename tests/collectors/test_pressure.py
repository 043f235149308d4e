from __future__ import annotations

import pytest

from nvdaemon.collectors.base import HostRoots
from nvdaemon.collectors.pressure import PressureCollector, PsiLine, parse_pressure
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, collect, devices, find, value


def test_healthy() -> None:
    gathered, samples = collect(PressureCollector(), HEALTHY)
    assert gathered.errors == []
    assert devices(samples, "psi_stall_ratio_avg10") == {"cpu", "memory", "io"}  # no irq file on this host
    assert value(samples, "psi_stall_ratio_avg10", "cpu", share="some") == 0.52
    assert value(samples, "psi_stall_ratio_avg300", "cpu", share="some") == 0.31
    assert value(samples, "psi_stall_ratio_avg10", "cpu", share="full") == 0.0  # newer kernels: a full line of zeros
    assert value(samples, "psi_stall_ratio_avg10", "io", share="full") == 0.06
    stall = find(samples, "psi_stall_seconds_total", "memory", share="some")
    assert stall.value == pytest.approx(2.345678)
    assert stall.kind is Kind.COUNTER
    assert find(samples, "psi_stall_ratio_avg60", "io", share="some").kind is Kind.GAUGE
    assert len(samples) == 3 * 2 * 4


def test_faulty_memory_and_io_pressure() -> None:
    _, samples = collect(PressureCollector(), FAULTY)
    assert value(samples, "psi_stall_ratio_avg10", "memory", share="some") == 35.12
    assert value(samples, "psi_stall_ratio_avg10", "io", share="some") == 40.25
    assert value(samples, "psi_stall_ratio_avg10", "io", share="full") == 25.37
    assert value(samples, "psi_stall_seconds_total", "io", share="full") == pytest.approx(1234.56789)
    # Old-kernel cpu file: only a some line. irq: only a full line.
    assert {dict(s.labels)["share"] for s in samples if s.device == "cpu"} == {"some"}
    assert value(samples, "psi_stall_seconds_total", "irq", share="full") == pytest.approx(0.012345)


def test_one_malformed_file_keeps_the_others(healthy_copy: HostRoots) -> None:
    (healthy_copy.proc / "pressure" / "memory").write_text("some avg10=lots\n")
    gathered, samples = collect(PressureCollector(), healthy_copy)
    assert len(gathered.errors) == 1 and "pressure/memory" in gathered.errors[0]
    assert devices(samples, "psi_stall_ratio_avg10") == {"cpu", "io"}


def test_truncated_file_is_an_error(healthy_copy: HostRoots) -> None:
    path = healthy_copy.proc / "pressure" / "io"
    path.write_text(path.read_text()[:30])
    gathered, samples = collect(PressureCollector(), healthy_copy)
    assert len(gathered.errors) == 1 and "pressure/io" in gathered.errors[0]
    assert "io" not in {s.device for s in samples}


def test_parse_exact() -> None:
    parsed = parse_pressure("some avg10=1.50 avg60=2.00 avg300=3.25 total=42\n", "cpu")
    assert parsed == {"some": PsiLine(1.5, 2.0, 3.25, 42)}
