"""CPU utilisation and scheduler counters from ``<proc>/stat``.

``cpu``/``cpuN`` lines hold cumulative time per state in USER_HZ ticks (user nice system idle iowait irq softirq
steal guest guest_nice). Percentages come from the delta between two ticks, so the collector keeps the previous
line per CPU; ``guest``/``guest_nice`` are already included in ``user``/``nice`` and are left out of the total.
``cpu_util_pct`` (device ``cpu`` for the aggregate line, ``cpu0``..``cpuN``) is the Go agent's: 100 * busy / (busy +
idle) with busy = user+nice+system+irq+softirq+steal and idle = idle+iowait; the first tick is the baseline and
emits no percentage. ``cpu_iowait_pct`` and ``cpu_steal_pct`` are ours, over the same denominator.
``ctxt``, ``intr`` (first number: all interrupts) and ``processes`` (forks since boot) are plain counters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nvdaemon.collectors.base import (
    Collector,
    Gathered,
    HostRoots,
    Interpreted,
    ParseError,
    all_uints,
    interpreted,
    read_proc,
)
from nvdaemon.collectors.bounds import ENTRIES_MAX, Problems, split_fields, too_many
from nvdaemon.model import Kind, Sample

_CPU_NAME = re.compile(r"cpu[0-9]*", re.ASCII)
_UINT = re.compile(r"[0-9]{1,25}", re.ASCII)  # bounded: int() refuses very long digit strings
_STATES = 8  # user nice system idle iowait irq softirq steal; older kernels print fewer, padded with zeros
IDLE, IOWAIT, STEAL = 3, 4, 7
_COUNTERS = {"ctxt": "cpu_context_switches_total", "intr": "cpu_interrupts_total", "processes": "procs_forked_total"}


@dataclass
class CpuStat:
    times: dict[str, tuple[int, ...]] = field(default_factory=dict)  # "cpu" (aggregate), "cpu0", ...
    counters: dict[str, int] = field(default_factory=dict)  # keys of _COUNTERS
    cpu_count: int = 0  # cpuN lines seen: the online CPUs
    errors: Problems = field(default_factory=Problems)


def read_stat(roots: HostRoots) -> str:
    return read_proc(roots.proc / "stat")


def _uints(tokens: list[str], what: str) -> list[int]:
    if not all_uints(tokens):
        bad = next(t for t in tokens if not _UINT.fullmatch(t))
        raise ParseError(f"/proc/stat: {what}: bad number {bad[:40]!r}")
    return list(map(int, tokens))


def _cpu_times(key: str, tokens: list[str]) -> tuple[int, ...]:
    values = _uints(tokens, key)
    if len(values) < 4:
        raise ParseError(f"/proc/stat: {key}: expected at least 4 fields, got {len(values)}")
    return tuple((values + [0] * _STATES)[:_STATES])


def _counter(key: str, tokens: list[str]) -> int:
    if not tokens:
        raise ParseError(f"/proc/stat: {key}: no value")
    return _uints(tokens[:1], key)[0]


def parse_stat(text: str) -> CpuStat:
    """Parse /proc/stat. A malformed line is listed in ``errors``; no usable aggregate ``cpu`` line raises."""
    stat = CpuStat()
    capped = False  # more than ENTRIES_MAX cpuN lines: the rest are not read
    for line in text.splitlines():
        # The key alone first: the intr line (one count per IRQ, up to a MiB) is never split whole.
        head = line.split(None, 1)
        if not head:
            continue
        key = head[0]
        try:
            if _CPU_NAME.fullmatch(key):
                if key in stat.times or len(stat.times) <= ENTRIES_MAX:  # the aggregate line and ENTRIES_MAX CPUs
                    stat.cpu_count += key != "cpu"
                    stat.times[key] = _cpu_times(key, split_fields(line, f"/proc/stat: {key}")[1:])
                elif not capped:
                    capped = True
                    stat.errors.append(too_many("/proc/stat"))
            elif key in _COUNTERS:
                stat.counters[key] = _counter(key, line.split(None, 2)[1:2])
        except ParseError as exc:
            stat.errors.append(str(exc))
    if "cpu" not in stat.times:
        raise ParseError("/proc/stat: no aggregate cpu line" + (f" ({stat.errors[0]})" if stat.errors else ""))
    return stat


class CpuCollector(Collector):
    name = "cpu"
    tier = "core"
    may_hang = False  # one /proc file, answered from kernel memory

    def __init__(self) -> None:
        # Previous tick's times per CPU: the baseline for percentages. Only ``interpret`` touches it.
        self._prev: dict[str, tuple[int, ...]] = {}

    def gather(self, roots: HostRoots) -> Gathered:
        stat = parse_stat(read_stat(roots))
        return Gathered(stat, errors=stat.errors.summary())

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        stat: CpuStat = gathered.data
        out: list[Sample] = []

        def add(metric: str, device: str, value: float, kind: Kind = Kind.GAUGE) -> None:
            out.append(Sample(metric=metric, device=device, value=value, kind=kind, tier="core", timestamp=now))

        for cpu, times in stat.times.items():
            prev = self._prev.get(cpu)
            # Always re-baseline: after a backwards step (hotplug, counter reset) the next tick is valid again.
            self._prev[cpu] = times
            if prev is None:
                continue
            deltas = [cur - old for cur, old in zip(times, prev, strict=True)]
            # The Go agent's formula: busy = user+nice+system+irq+softirq+steal, idle = idle+iowait; a tick where
            # either sum went backwards (counter reset) is skipped, a per-state dip inside a sum is not.
            idle = deltas[IDLE] + deltas[IOWAIT]
            busy = sum(deltas) - idle
            total = busy + idle
            if busy < 0 or idle < 0 or total <= 0:
                continue
            add("cpu_util_pct", cpu, 100.0 * busy / total)
            if deltas[IOWAIT] >= 0:
                add("cpu_iowait_pct", cpu, 100.0 * deltas[IOWAIT] / total)
            if deltas[STEAL] >= 0:
                add("cpu_steal_pct", cpu, 100.0 * deltas[STEAL] / total)
        # Forget CPUs that went offline so a returning CPU starts from a fresh baseline.
        for gone in set(self._prev) - set(stat.times):
            del self._prev[gone]
        for key, metric in _COUNTERS.items():
            if key in stat.counters:
                add(metric, "cpu", float(stat.counters[key]), Kind.COUNTER)
        add("cpus_online", "cpu", float(stat.cpu_count))
        return interpreted(out)
