from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.collectors.base import Gathered, HostRoots, ParseError
from nvdaemon.collectors.memory import MemoryCollector, parse_meminfo
from tests.collectors.conftest import FAULTY, HEALTHY, collect, value

KIB = 1024


def _drop_line(roots: HostRoots, key: str) -> None:
    path = roots.proc / "meminfo"
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(key + ":")]
    path.write_text("\n".join(lines) + "\n")


def test_healthy() -> None:
    gathered, samples = collect(MemoryCollector(), HEALTHY)
    assert gathered.errors == []
    assert value(samples, "mem_total_bytes", "mem") == 65844004 * KIB
    assert value(samples, "mem_free_bytes", "mem") == 38127456 * KIB
    assert value(samples, "mem_available_bytes", "mem") == 55019844 * KIB
    assert value(samples, "mem_buffers_bytes", "mem") == 612340 * KIB
    assert value(samples, "mem_cached_bytes", "mem") == 16254876 * KIB
    assert value(samples, "swap_total_bytes", "mem") == 8388604 * KIB
    assert value(samples, "swap_free_bytes", "mem") == 8388604 * KIB
    assert value(samples, "mem_dirty_bytes", "mem") == 1284 * KIB
    assert value(samples, "mem_hardware_corrupted_bytes", "mem") == 0
    assert value(samples, "mem_used_pct", "mem") == pytest.approx(100 * (65844004 - 55019844) / 65844004)
    assert value(samples, "mem_used_bytes", "mem") == (65844004 - 55019844) * KIB
    assert value(samples, "swap_used_bytes", "mem") == 0
    assert len(samples) == 12
    assert {s.device for s in samples} == {"mem"}


def test_faulty_has_little_available_and_corrupted_pages() -> None:
    _, samples = collect(MemoryCollector(), FAULTY)
    assert value(samples, "mem_available_bytes", "mem") == 1975320 * KIB
    assert value(samples, "mem_used_pct", "mem") == pytest.approx(97.0, abs=0.01)
    assert value(samples, "mem_hardware_corrupted_bytes", "mem") == 4 * KIB
    assert value(samples, "swap_used_bytes", "mem") == (8388604 - 1048576) * KIB


def test_go_agent_values() -> None:
    """The Go agent's own test host: 16000000/8000000 kB with swap 4000000/3000000."""
    text = "MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\nSwapTotal: 4000000 kB\nSwapFree: 3000000 kB\n"
    samples = list(MemoryCollector().interpret(Gathered(parse_meminfo(text)), 0.0).samples)
    assert value(samples, "mem_used_bytes", "mem") == 8000000 * KIB
    assert value(samples, "swap_used_bytes", "mem") == 1000000 * KIB


@pytest.mark.parametrize("line", ["SwapTotal", "SwapFree"])
def test_swap_used_absent_without_both_swap_lines(healthy_copy: HostRoots, line: str) -> None:
    _drop_line(healthy_copy, line)
    _, samples = collect(MemoryCollector(), healthy_copy)
    assert "swap_used_bytes" not in {s.metric for s in samples}
    assert value(samples, "mem_used_bytes", "mem") == (65844004 - 55019844) * KIB


def test_old_kernel_without_memavailable(healthy_copy: HostRoots) -> None:
    _drop_line(healthy_copy, "MemAvailable")
    _, samples = collect(MemoryCollector(), healthy_copy)
    metrics = {s.metric for s in samples}
    assert "mem_available_bytes" not in metrics
    assert "mem_used_pct" not in metrics
    assert "mem_used_bytes" not in metrics
    assert value(samples, "mem_total_bytes", "mem") == 65844004 * KIB


def test_hardware_corrupted_only_when_present(healthy_copy: HostRoots) -> None:
    _drop_line(healthy_copy, "HardwareCorrupted")
    _, samples = collect(MemoryCollector(), healthy_copy)
    assert "mem_hardware_corrupted_bytes" not in {s.metric for s in samples}


def test_malformed_line_is_an_error_but_the_rest_survives(healthy_copy: HostRoots) -> None:
    path = healthy_copy.proc / "meminfo"
    path.write_text(path.read_text().replace("Buffers:          612340 kB", "Buffers:    lots kB"))
    gathered, samples = collect(MemoryCollector(), healthy_copy)
    assert len(gathered.errors) == 1 and "/proc/meminfo" in gathered.errors[0] and "Buffers" in gathered.errors[0]
    assert "mem_buffers_bytes" not in {s.metric for s in samples}
    assert value(samples, "mem_cached_bytes", "mem") == 16254876 * KIB


def test_page_counts_are_not_scaled() -> None:
    info = parse_meminfo("MemTotal: 4 kB\nHugePages_Total:      12\n")
    assert info.values == {"MemTotal": 4096, "HugePages_Total": 12}


_GOOD = st.tuples(
    st.sampled_from(["MemTotal", "Active(anon)", "Hugepagesize", "HardwareCorrupted"]),
    st.sampled_from([":", ": ", ":\t", ":      "]),
    st.sampled_from(["0", "65844004", "1" * 25]),
    st.sampled_from(["", " kB", "\tkB", " kB "]),
).map("".join)
_PIECES = st.sampled_from(["MemTotal", "Active(anon)", ":", " ", "\t", "\r", "\x0b", "\x1c", "\x1f", "é", "kB"])
_ODD = st.tuples(
    st.lists(_PIECES, min_size=1, max_size=3).map("".join),
    st.sampled_from([":", ": ", ":\t", " ", ""]),
    st.sampled_from(["0", "65844004", "1" * 26, "-1", "x", ""]),
    st.sampled_from(["", " kB", "\tkB", " MB", " ", "\r"]),
).map("".join)


@given(st.lists(st.one_of(_GOOD, _GOOD, _GOOD, _ODD, st.sampled_from(["", "   "])), max_size=6))
def test_the_one_scan_of_a_whole_file_reads_what_the_line_loop_reads(lines: list[str]) -> None:
    """A text ending in a newline may take the one-scan way; the same text without it takes the per-line loop."""
    text = "\n".join(lines)
    outcomes: list[object] = []
    for candidate in (text, text + "\n"):
        try:
            info = parse_meminfo(candidate)
            outcomes.append((info.values, info.errors))
        except ParseError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
