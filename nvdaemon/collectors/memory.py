"""Memory and swap from ``<proc>/meminfo``.

Lines are ``Name:   value kB`` (kibibytes, converted to bytes here) or ``HugePages_Total:  0`` (a page count,
kept as is). ``MemAvailable`` only exists since Linux 3.14: without it the available/used samples are omitted
rather than guessed.

The Go agent's four series (device ``mem``): ``mem_total_bytes``, ``mem_available_bytes``, ``mem_used_bytes``
(MemTotal - MemAvailable) and ``swap_used_bytes`` (SwapTotal - SwapFree; absent without both swap lines). Every other
memory-family series of ours uses the same device ``mem``, so a dashboard filtering ``device="mem"`` sees them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nvdaemon.collectors.base import Collector, Gathered, HostRoots, Interpreted, ParseError, interpreted, read_proc
from nvdaemon.collectors.bounds import Problems
from nvdaemon.model import Kind, Sample

_LINE = re.compile(r"([^\s:]+):\s*([0-9]{1,25})(?:\s+(kB))?\s*", re.ASCII)  # bounded digits: int() limit
# The same line, one per text line: printable-ASCII names and blanks only, so a match is a line as splitlines cuts it.
_LINES = re.compile(r"^([!-9;-~]+):[ \t]*([0-9]{1,25})(?:[ \t]+(kB))?[ \t]*$", re.ASCII | re.MULTILINE)

DEVICE = "mem"  # the Go agent's device for every memory series

# meminfo key -> metric; each emitted only when its key is present.
_DIRECT = {
    "MemTotal": "mem_total_bytes",
    "MemFree": "mem_free_bytes",
    "MemAvailable": "mem_available_bytes",
    "Buffers": "mem_buffers_bytes",
    "Cached": "mem_cached_bytes",
    "SwapTotal": "swap_total_bytes",
    "SwapFree": "swap_free_bytes",
    "HardwareCorrupted": "mem_hardware_corrupted_bytes",
    "Dirty": "mem_dirty_bytes",
}


@dataclass
class MemInfo:
    values: dict[str, int] = field(default_factory=dict)  # bytes for kB lines, plain counts otherwise
    # Lines that did not parse; the read's shape check (at most LINES_MAX lines) bounds ``values`` too.
    errors: Problems = field(default_factory=Problems)


def read_meminfo(roots: HostRoots) -> str:
    return read_proc(roots.proc / "meminfo")


def parse_meminfo(text: str) -> MemInfo:
    """Parse /proc/meminfo; malformed lines go to ``errors``, and no usable line at all raises ``ParseError``."""
    lines = _LINES.findall(text)
    if lines and text.endswith("\n") and len(lines) == text.count("\n"):
        # Every line matched whole (the usual file): one scan gives what the loop below would, without a regex call
        # per line.
        return MemInfo({key: int(value) * 1024 if kb else int(value) for key, value, kb in lines})
    info = MemInfo()
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            info.errors.append(f"/proc/meminfo: malformed line {line[:60]!r}")
            continue
        value = int(m.group(2))
        info.values[m.group(1)] = value * 1024 if m.group(3) else value
    if not info.values:
        raise ParseError("/proc/meminfo: no usable lines" + (f" ({info.errors[0]})" if info.errors else ""))
    return info


class MemoryCollector(Collector):
    name = "memory"
    tier = "core"
    may_hang = False  # one /proc file, answered from kernel memory

    def gather(self, roots: HostRoots) -> Gathered:
        info = parse_meminfo(read_meminfo(roots))
        return Gathered(info, errors=info.errors.summary())

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        values: dict[str, int] = gathered.data.values
        out: list[Sample] = []

        def add(metric: str, value: float) -> None:
            out.append(Sample(metric=metric, device=DEVICE, value=value, kind=Kind.GAUGE, tier="core", timestamp=now))

        for key, metric in _DIRECT.items():
            if key in values:
                add(metric, float(values[key]))
        total, available = values.get("MemTotal"), values.get("MemAvailable")
        if total is not None and available is not None:
            add("mem_used_bytes", float(total - available))
            if total:
                add("mem_used_pct", 100.0 * (total - available) / total)
        swap_total, swap_free = values.get("SwapTotal"), values.get("SwapFree")
        if swap_total is not None and swap_free is not None:
            add("swap_used_bytes", float(swap_total - swap_free))
        return interpreted(out)
