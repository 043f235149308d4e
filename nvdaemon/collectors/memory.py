"""Memory and swap from ``<proc>/meminfo``.

Lines are ``Name:   value kB`` (kibibytes, converted to bytes here) or ``HugePages_Total:  0`` (a page count,
kept as is). ``MemAvailable`` only exists since Linux 3.14: without it the available/used samples are omitted
rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from nvdaemon.collectors.base import Collector, Gathered, HostRoots, ParseError, read_text
from nvdaemon.model import Kind, Sample

_LINE = re.compile(r"([^\s:]+):\s*([0-9]{1,25})(?:\s+(kB))?\s*", re.ASCII)  # bounded digits: int() limit

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
    errors: list[str] = field(default_factory=list)


def read_meminfo(roots: HostRoots) -> str:
    return read_text(roots.proc / "meminfo")


def parse_meminfo(text: str) -> MemInfo:
    """Parse /proc/meminfo; malformed lines go to ``errors``, and no usable line at all raises ``ParseError``."""
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

    def gather(self, roots: HostRoots) -> Gathered:
        info = parse_meminfo(read_meminfo(roots))
        return Gathered(info, errors=list(info.errors))

    def interpret(self, gathered: Gathered, now: float) -> list[Sample]:
        values: dict[str, int] = gathered.data.values
        out = [
            Sample(metric=metric, device="memory", value=float(values[key]), tier="core", timestamp=now)
            for key, metric in _DIRECT.items()
            if key in values
        ]
        total, available = values.get("MemTotal"), values.get("MemAvailable")
        if total and available is not None:
            used = 100.0 * (total - available) / total
            out.append(
                Sample(metric="mem_used_pct", device="memory", value=used, kind=Kind.GAUGE, tier="core", timestamp=now)
            )
        return out
