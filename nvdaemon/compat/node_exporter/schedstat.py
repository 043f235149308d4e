"""schedstat: per-CPU scheduler time from ``<proc>/schedstat`` (nanoseconds, served as seconds).

A ``cpuN`` line (format version 15) holds nine counters; node_exporter serves the last three:
``node_schedstat_running_seconds_total{cpu}`` (time tasks ran on the CPU), ``..._waiting_seconds_total{cpu}``
(time runnable tasks waited for it) and ``node_schedstat_timeslices_total{cpu}``. ``domainN`` lines are ignored.

node_exporter 1.5 (procfs 0.8) is lenient: a line that does not look like a cpu line, or whose counter does not fit
64 bits, is skipped, and a read that stops early (a line over 64 KiB) ends the scan without an error. Only a
missing file (no CONFIG_SCHEDSTATS) fails the collector, as ``ErrNoData``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.goparse import MAX_LINE

# Unanchored, single spaces: the first nine numbers after "cpuN" anywhere in the line.
_CPU_LINE = re.compile(r"cpu(\d+)" + r" (\d+)" * 9, re.ASCII)
NS_PER_SECOND = 1e9


@dataclass(frozen=True)
class SchedCpu:
    cpu: str  # the N of cpuN, as the kernel spells it
    running_ns: int
    waiting_ns: int
    timeslices: int


def parse_schedstat(text: str) -> list[SchedCpu]:
    cpus: list[SchedCpu] = []
    for line in text.split("\n"):
        if len(line.encode()) >= MAX_LINE:
            break  # bufio.Scanner gives up; procfs does not check its error
        m = _CPU_LINE.search(line)
        if m is None:
            continue
        running, waiting, slices = (int(v) for v in m.group(8, 9, 10))
        if max(running, waiting, slices) >= 1 << 64:
            continue
        cpus.append(SchedCpu(m.group(1), running, waiting, slices))
    return cpus


def collect(ctx: NodeContext, out: list[Family]) -> None:
    try:
        text = ctx.read(ctx.proc("schedstat"))  # absent: NoData, as node_exporter's ErrNoData
    except IsADirectoryError:
        text = ""  # Go opens a directory fine and its scanner's read error ends the loop silently
    cpus = parse_schedstat(text)
    running_help = "Number of seconds CPU spent running a process."
    running = Family("node_schedstat_running_seconds_total", running_help, "counter")
    waiting_help = "Number of seconds spent by processing waiting for this CPU."
    waiting = Family("node_schedstat_waiting_seconds_total", waiting_help, "counter")
    slices = Family("node_schedstat_timeslices_total", "Number of timeslices executed by CPU.", "counter")
    for cpu in cpus:
        running.add(cpu.running_ns / NS_PER_SECOND, cpu=cpu.cpu)
        waiting.add(cpu.waiting_ns / NS_PER_SECOND, cpu=cpu.cpu)
        slices.add(float(cpu.timeslices), cpu=cpu.cpu)
    out += [running, waiting, slices]
