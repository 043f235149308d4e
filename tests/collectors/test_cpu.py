from __future__ import annotations

from pathlib import Path

import pytest

from nvdaemon.collectors.base import HostRoots
from nvdaemon.collectors.cpu import CpuCollector, parse_stat
from nvdaemon.model import Kind, Sample
from tests.collectors.conftest import FAULTY, HEALTHY, collect, devices, find, value

UTIL = ("cpu_util_pct", "cpu_iowait_pct", "cpu_steal_pct")


def bump(text: str, deltas: dict[str, list[int]]) -> str:
    """/proc/stat text with the given per-field increments added to the named cpu lines."""
    out = []
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in deltas:
            extra = deltas[fields[0]] + [0] * 10
            fields = [fields[0]] + [str(int(v) + extra[i]) for i, v in enumerate(fields[1:])]
        out.append(" ".join(fields))
    return "\n".join(out) + "\n"


def tick(collector: CpuCollector, roots: HostRoots, now: float) -> list[Sample]:
    return list(collector.interpret(collector.gather(roots), now).samples)


def test_first_tick_has_counters_but_no_utilisation() -> None:
    gathered, samples = collect(CpuCollector(), HEALTHY)
    assert gathered.errors == []
    assert not [s for s in samples if s.metric in UTIL]
    assert value(samples, "cpu_context_switches_total", "cpu") == 318273645
    assert value(samples, "cpu_interrupts_total", "cpu") == 182736451
    assert value(samples, "procs_forked_total", "cpu") == 2184562
    assert find(samples, "procs_forked_total", "cpu").kind is Kind.COUNTER
    assert value(samples, "cpus_online", "cpu") == 4
    assert find(samples, "cpus_online", "cpu").kind is Kind.GAUGE


def test_faulty_counters() -> None:
    _, samples = collect(CpuCollector(), FAULTY)
    assert value(samples, "cpu_context_switches_total", "cpu") == 918273645
    assert value(samples, "cpus_online", "cpu") == 4


def test_second_tick_gives_percentages(healthy_copy: HostRoots) -> None:
    stat = healthy_copy.proc / "stat"
    collector = CpuCollector()
    tick(collector, healthy_copy, 1.0)
    # cpu0: user+60 system+20 idle+100 iowait+10 steal+10 -> total 200, idle+iowait 110, so 45 % busy
    # (steal counts as busy), iowait 5 %, steal 5 %.
    # cpu1: all idle. cpu2: all busy. cpu3: unchanged. Aggregate: the sum of the four.
    stat.write_text(
        bump(
            stat.read_text(),
            {
                "cpu": [60 + 100, 0, 20, 100 + 200, 10, 0, 0, 10],
                "cpu0": [60, 0, 20, 100, 10, 0, 0, 10],
                "cpu1": [0, 0, 0, 200],
                "cpu2": [100],
            },
        )
    )
    samples = tick(collector, healthy_copy, 2.0)
    assert value(samples, "cpu_util_pct", "cpu0") == pytest.approx(45.0)
    assert value(samples, "cpu_iowait_pct", "cpu0") == pytest.approx(5.0)
    assert value(samples, "cpu_steal_pct", "cpu0") == pytest.approx(5.0)
    assert value(samples, "cpu_util_pct", "cpu1") == 0.0
    assert value(samples, "cpu_util_pct", "cpu2") == 100.0
    # Aggregate: total 500, idle+iowait 310 -> 38 % busy.
    assert value(samples, "cpu_util_pct", "cpu") == pytest.approx(38.0)
    assert value(samples, "cpu_iowait_pct", "cpu") == pytest.approx(2.0)
    # cpu3 did not move: a zero delta gives no sample rather than a made-up 0 %.
    assert devices(samples, "cpu_util_pct") == {"cpu", "cpu0", "cpu1", "cpu2"}
    assert all(s.timestamp == 2.0 for s in samples)


def test_backwards_counter_is_skipped_and_rebaselined(healthy_copy: HostRoots) -> None:
    stat = healthy_copy.proc / "stat"
    base = stat.read_text()
    collector = CpuCollector()
    tick(collector, healthy_copy, 1.0)
    # cpu1's idle goes back by 1000 (hotplug resets), everything else moves forward.
    second = bump(base, {"cpu": [50, 0, 0, 50], "cpu0": [50, 0, 0, 50], "cpu1": [10, 0, 0, -1000]})
    stat.write_text(second)
    samples = tick(collector, healthy_copy, 2.0)
    assert "cpu1" not in devices(samples, "cpu_util_pct")
    assert value(samples, "cpu_util_pct", "cpu0") == pytest.approx(50.0)
    # The next tick measures cpu1 against the (lower) values seen at tick 2.
    stat.write_text(bump(second, {"cpu1": [30, 0, 0, 70]}))
    samples = tick(collector, healthy_copy, 3.0)
    assert value(samples, "cpu_util_pct", "cpu1") == pytest.approx(30.0)


def test_go_agent_example(tmp_path: Path) -> None:
    """The Go agent's own test values: ``cpu 100 0 100 800`` then ``400 0 200 1200`` give 50 %."""
    roots = HostRoots.under(tmp_path)
    roots.proc.mkdir()
    collector = CpuCollector()
    (roots.proc / "stat").write_text("cpu 100 0 100 800\ncpu0 100 0 100 800\n")
    assert not [s for s in tick(collector, roots, 1.0) if s.metric in UTIL]  # the first tick is the baseline
    (roots.proc / "stat").write_text("cpu 400 0 200 1200\ncpu0 400 0 200 1200\n")
    samples = tick(collector, roots, 2.0)
    assert value(samples, "cpu_util_pct", "cpu") == 50.0
    assert value(samples, "cpu_util_pct", "cpu0") == 50.0


def test_a_dip_inside_the_idle_sum_still_counts(healthy_copy: HostRoots) -> None:
    """iowait can step back on some kernels; as in Go only the busy and idle sums must not go backwards."""
    stat = healthy_copy.proc / "stat"
    collector = CpuCollector()
    tick(collector, healthy_copy, 1.0)
    # cpu0: user+50, idle+60, iowait-10 -> busy 50, idle 50.
    stat.write_text(bump(stat.read_text(), {"cpu0": [50, 0, 0, 60, -10]}))
    samples = tick(collector, healthy_copy, 2.0)
    assert value(samples, "cpu_util_pct", "cpu0") == pytest.approx(50.0)
    assert "cpu0" not in devices(samples, "cpu_iowait_pct")  # no negative percentage of ours either
    assert value(samples, "cpu_steal_pct", "cpu0") == 0.0


def test_identical_ticks_give_no_utilisation(healthy_copy: HostRoots) -> None:
    collector = CpuCollector()
    tick(collector, healthy_copy, 1.0)
    samples = tick(collector, healthy_copy, 2.0)
    assert not [s for s in samples if s.metric in UTIL]
    assert value(samples, "cpus_online", "cpu") == 4


def test_offline_cpu_disappears(healthy_copy: HostRoots) -> None:
    stat = healthy_copy.proc / "stat"
    collector = CpuCollector()
    tick(collector, healthy_copy, 1.0)
    lines = [ln for ln in stat.read_text().splitlines() if not ln.startswith("cpu3 ")]
    stat.write_text(bump("\n".join(lines), {"cpu": [10, 0, 0, 10], "cpu0": [10, 0, 0, 10]}))
    samples = tick(collector, healthy_copy, 2.0)
    assert value(samples, "cpus_online", "cpu") == 3
    assert "cpu3" not in devices(samples, "cpu_util_pct")
    assert value(samples, "cpu_util_pct", "cpu0") == pytest.approx(50.0)


def test_malformed_cpu_line_keeps_the_others(healthy_copy: HostRoots) -> None:
    stat = healthy_copy.proc / "stat"
    collector = CpuCollector()
    tick(collector, healthy_copy, 1.0)
    text = bump(stat.read_text(), {"cpu": [20, 0, 0, 20], "cpu0": [10, 0, 0, 10], "cpu1": [10, 0, 0, 10]})
    stat.write_text(text.replace("cpu2 ", "cpu2 x", 1))
    gathered = collector.gather(healthy_copy)
    assert len(gathered.errors) == 1
    assert "/proc/stat" in gathered.errors[0] and "cpu2" in gathered.errors[0]
    samples = list(collector.interpret(gathered, 2.0).samples)
    assert devices(samples, "cpu_util_pct") == {"cpu", "cpu0", "cpu1"}
    assert value(samples, "cpu_util_pct", "cpu1") == pytest.approx(50.0)
    assert value(samples, "cpus_online", "cpu") == 4


def test_old_kernel_short_lines_are_padded() -> None:
    stat = parse_stat("cpu  10 0 5 85\ncpu0 10 0 5 85\nctxt 7\n")
    assert stat.times["cpu"] == (10, 0, 5, 85, 0, 0, 0, 0)
    assert stat.counters == {"ctxt": 7}
    assert stat.cpu_count == 1
