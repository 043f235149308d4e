"""Load averages and process counts from ``<proc>/loadavg``.

The file is one line: ``0.52 0.61 0.58 2/1024 123456`` -- the 1/5/15 minute load averages (runnable plus
uninterruptible tasks, no unit), ``running/total`` scheduling entities, and the last PID handed out (ignored).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvdaemon.collectors.base import Collector, Gathered, HostRoots, Interpreted, ParseError, interpreted, read_proc
from nvdaemon.collectors.bounds import split_fields
from nvdaemon.model import Kind, Sample

# ASCII-only patterns: ``float``/``int`` would also accept "nan", "1_0" or Arabic-Indic digits.
_LOAD = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,20})?", re.ASCII)
_PROCS = re.compile(r"([0-9]{1,20})/([0-9]{1,20})", re.ASCII)


@dataclass(frozen=True)
class LoadAvg:
    load1: float
    load5: float
    load15: float
    procs_running: int
    procs_total: int


def read_loadavg(roots: HostRoots) -> str:
    return read_proc(roots.proc / "loadavg")


def parse_loadavg(text: str) -> LoadAvg:
    """Parse the single line of /proc/loadavg; anything else (more than ``FIELDS_MAX`` fields included: the
    kernel writes 5) is a ``ParseError``."""
    fields = split_fields(text, "/proc/loadavg")  # the whole text, as node_exporter's strings.Fields takes it
    if len(fields) < 4:
        raise ParseError(f"/proc/loadavg: expected at least 4 fields, got {len(fields)}")
    loads: list[float] = []
    for token in fields[:3]:
        if not _LOAD.fullmatch(token):
            raise ParseError(f"/proc/loadavg: bad load average {token[:40]!r}")
        loads.append(float(token))
    procs = _PROCS.fullmatch(fields[3])
    if procs is None:
        raise ParseError(f"/proc/loadavg: bad running/total field {fields[3][:40]!r}")
    return LoadAvg(loads[0], loads[1], loads[2], int(procs.group(1)), int(procs.group(2)))


class LoadAvgCollector(Collector):
    name = "loadavg"
    tier = "core"
    may_hang = False  # one /proc file, answered from kernel memory

    def gather(self, roots: HostRoots) -> Gathered:
        return Gathered(parse_loadavg(read_loadavg(roots)))

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        data: LoadAvg = gathered.data
        values = {
            "load1": data.load1,
            "load5": data.load5,
            "load15": data.load15,
            "procs_running": float(data.procs_running),
            "procs_existing": float(data.procs_total),
        }
        return interpreted(
            Sample(metric=m, device="cpu", value=v, kind=Kind.GAUGE, tier="core", timestamp=now)
            for m, v in values.items()
        )
