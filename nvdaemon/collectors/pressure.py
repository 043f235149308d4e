"""Pressure stall information from ``<proc>/pressure/{cpu,memory,io,irq}``.

Each file has a ``some`` and/or a ``full`` line: ``some avg10=0.52 avg60=0.43 avg300=0.31 total=123456789``.
The averages are the percentage of wall time in which some (or all non-idle) tasks stalled on that resource over
10 s, 60 s and 300 s; ``total`` is the cumulative stall time in microseconds, reported as seconds. Old kernels
print only ``some`` for cpu, newer ones a ``full`` line of zeros; ``irq`` (only ``full``) needs Linux 6.1 with
CONFIG_IRQ_TIME_ACCOUNTING. Without CONFIG_PSI there is no /proc/pressure at all.

Series are the Go agent's: ``psi_stall_ratio_avg10/avg60/avg300`` (gauges; the value is the kernel's *percent*
despite the name) and ``psi_stall_seconds_total`` (counter), device the resource, label ``share`` = some/full.
``irq`` is ours (Go reads cpu, memory and io only).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from nvdaemon.collectors.base import (
    Collector,
    Gathered,
    HostRoots,
    Interpreted,
    NotPresent,
    ParseError,
    interpreted,
    read_proc,
)
from nvdaemon.model import Kind, Sample, make_labels

RESOURCES = ("cpu", "memory", "io", "irq")
_SHARE_LABELS = {share: make_labels({"share": share}) for share in ("some", "full")}  # made once, not per sample
_NUM = r"[0-9]{1,20}\.[0-9]{1,20}"
_LINE = re.compile(
    rf"(some|full)\s+avg10=({_NUM})\s+avg60=({_NUM})\s+avg300=({_NUM})\s+total=([0-9]{{1,25}})\s*", re.ASCII
)


@dataclass(frozen=True)
class PsiLine:
    avg10: float
    avg60: float
    avg300: float
    total_us: int


def read_pressure(roots: HostRoots, resource: str) -> str:
    return read_proc(f"{roots.proc}/pressure/{resource}")  # a string: a Path per file cost more than its parse


def parse_pressure(text: str, resource: str = "?") -> dict[str, PsiLine]:
    """Parse one PSI file into ``{"some": ..., "full": ...}``; any malformed line fails the whole file."""
    lines: dict[str, PsiLine] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise ParseError(f"/proc/pressure/{resource}: malformed line {line[:80]!r}")
        lines[m.group(1)] = PsiLine(float(m.group(2)), float(m.group(3)), float(m.group(4)), int(m.group(5)))
    if not lines:
        raise ParseError(f"/proc/pressure/{resource}: empty")
    return lines


def _describe(roots: HostRoots, resource: str, exc: Exception) -> str:
    if isinstance(exc, OSError):
        return f"{roots.proc / 'pressure' / resource}: {exc.strerror or exc}"
    return str(exc)  # a ParseError already names the file


class PressureCollector(Collector):
    name = "pressure"
    tier = "core"
    may_hang = False  # /proc/pressure files, answered from kernel memory

    def gather(self, roots: HostRoots) -> Gathered:
        if not os.path.isdir(roots.proc / "pressure"):
            raise NotPresent(str(roots.proc / "pressure"))
        data: dict[str, dict[str, PsiLine]] = {}
        problems: list[tuple[str, Exception]] = []
        for resource in RESOURCES:
            try:
                data[resource] = parse_pressure(read_pressure(roots, resource), resource)
            except NotPresent:
                continue  # irq is often absent while the others exist
            except (OSError, ParseError) as exc:
                problems.append((resource, exc))
        if not data:
            if problems:
                raise problems[0][1]
            raise NotPresent(f"{roots.proc / 'pressure'}: no resource files")
        return Gathered(data, errors=[_describe(roots, res, exc) for res, exc in problems])

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        data: dict[str, dict[str, PsiLine]] = gathered.data
        out: list[Sample] = []
        for resource, lines in data.items():
            for share, psi in lines.items():
                labels = _SHARE_LABELS.get(share) or make_labels({"share": share})
                for metric, value, mkind in (
                    ("psi_stall_ratio_avg10", psi.avg10, Kind.GAUGE),
                    ("psi_stall_ratio_avg60", psi.avg60, Kind.GAUGE),
                    ("psi_stall_ratio_avg300", psi.avg300, Kind.GAUGE),
                    ("psi_stall_seconds_total", psi.total_us / 1_000_000, Kind.COUNTER),
                ):
                    out.append(
                        Sample(
                            metric=metric,
                            device=resource,
                            value=value,
                            kind=mkind,
                            labels=labels,
                            tier="core",
                            timestamp=now,
                        )
                    )
        return interpreted(out)
