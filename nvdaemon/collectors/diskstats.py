"""Block device I/O counters from ``<proc>/diskstats``.

Each line is ``major minor name`` then 11 fields (Linux < 4.18), 15 (adds 4 discard fields) or 17 (adds 2 flush
fields): reads completed, reads merged, sectors read, ms reading, writes completed, writes merged, sectors
written, ms writing, I/Os in progress, ms doing I/O, weighted ms, ... Sectors are always 512 bytes here,
whatever the device's logical block size. Times are milliseconds, reported as seconds.

The Go agent's four counters (``disk_read_bytes_total``, ``disk_write_bytes_total``, ``disk_read_ios_total``,
``disk_write_ios_total``) cover every line, partitions and loop devices included, as in Go: a rule or panel on
``sda1`` keeps working. Our additional time and queue series cover whole disks only, so that they add no series for
partitions and loop devices: a device is "whole" if ``<sys>/block/<name>`` exists (partitions live below their
disk, not in /sys/block); without /sys/block a name heuristic decides. loop, ram, zram, sr and fd devices are never
whole.
"""

from __future__ import annotations

import os
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
    read_table,
)
from nvdaemon.collectors.bounds import ENTRIES_MAX, FIELDS_MAX, LABEL_MAX, Problems, too_many
from nvdaemon.model import Kind, Sample

_UINT = re.compile(r"[0-9]{1,25}", re.ASCII)  # bounded: int() refuses very long digit strings
SECTOR = 512
_FIELD_COUNTS = frozenset({11, 15, 17})  # after major, minor and name: the 14-, 18- and 20-field formats
_SKIP = re.compile(r"(?:loop|ram|zram|sr|fd)[0-9]*", re.ASCII)
_WHOLE_BY_NAME = re.compile(r"(?:[shv]d[a-z]+|xvd[a-z]+|nvme[0-9]+n[0-9]+|mmcblk[0-9]+|md[0-9]+|dm-[0-9]+)", re.ASCII)

# Field index (after the name) -> (metric, factor, divisor, kind); ms are divided, not multiplied by 0.001,
# so that 1500 ms is exactly 1.5 s. GO_METRICS: every device (the Go agent's); WHOLE_METRICS: whole disks only.
GO_METRICS: dict[int, tuple[str, int, int, Kind]] = {
    0: ("disk_read_ios_total", 1, 1, Kind.COUNTER),
    2: ("disk_read_bytes_total", SECTOR, 1, Kind.COUNTER),
    4: ("disk_write_ios_total", 1, 1, Kind.COUNTER),
    6: ("disk_write_bytes_total", SECTOR, 1, Kind.COUNTER),
}
WHOLE_METRICS: dict[int, tuple[str, int, int, Kind]] = {
    3: ("disk_read_time_seconds_total", 1, 1000, Kind.COUNTER),
    7: ("disk_write_time_seconds_total", 1, 1000, Kind.COUNTER),
    8: ("disk_io_in_progress", 1, 1, Kind.GAUGE),
    9: ("disk_io_time_seconds_total", 1, 1000, Kind.COUNTER),
}


@dataclass
class DiskStats:
    devices: dict[str, tuple[int, ...]] = field(default_factory=dict)  # every line, partitions included
    errors: Problems = field(default_factory=Problems)


def read_diskstats(roots: HostRoots) -> str:
    return read_table(roots.proc / "diskstats")


def read_block_devices(roots: HostRoots) -> frozenset[str] | None:
    """Names under ``<sys>/block``, or ``None`` when that directory does not exist (fall back to names)."""
    try:
        return frozenset(os.listdir(roots.sys / "block"))
    except (FileNotFoundError, NotADirectoryError):
        return None


def parse_diskstats(text: str) -> DiskStats:
    """Parse /proc/diskstats. A malformed line goes to ``errors``; only malformed lines at all raises."""
    stats = DiskStats()
    for line in text.splitlines():
        fields = line.split(None, FIELDS_MAX)  # at most 23 in a real line; a longer one is not split whole
        if not fields:
            continue
        values = fields[3:]
        if (
            len(values) not in _FIELD_COUNTS
            or len(fields[2]) > LABEL_MAX
            or not _UINT.fullmatch(fields[0])
            or not _UINT.fullmatch(fields[1])
            or not all_uints(values)
        ):
            stats.errors.append(f"/proc/diskstats: malformed line {line.strip()[:80]!r}")
            continue
        if len(stats.devices) >= ENTRIES_MAX and fields[2] not in stats.devices:
            stats.errors.append(too_many("/proc/diskstats"))
            break
        stats.devices[fields[2]] = tuple(map(int, values))
    if stats.errors and not stats.devices:
        raise ParseError(stats.errors[0])
    return stats


def is_whole_disk(name: str, block_devices: frozenset[str] | None) -> bool:
    if _SKIP.fullmatch(name):
        return False
    if block_devices is not None:
        # /sys/block spells a "/" in a kernel name (cciss/c0d0) as "!".
        return name.replace("/", "!") in block_devices
    return _WHOLE_BY_NAME.fullmatch(name) is not None


class DiskStatsCollector(Collector):
    name = "diskstats"
    tier = "core"
    may_hang = False  # /proc/diskstats and a listing of /sys/block: kernel memory, no driver asked

    def gather(self, roots: HostRoots) -> Gathered:
        stats = parse_diskstats(read_diskstats(roots))  # NotPresent without /proc/diskstats
        block = read_block_devices(roots)
        whole = frozenset(n for n in stats.devices if is_whole_disk(n, block))
        return Gathered((stats.devices, whole), errors=stats.errors.summary())

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        devices: dict[str, tuple[int, ...]]
        whole: frozenset[str]
        devices, whole = gathered.data
        out: list[Sample] = []
        for dev, values in devices.items():
            table = (GO_METRICS, WHOLE_METRICS) if dev in whole else (GO_METRICS,)
            out.extend(
                Sample(metric=metric, device=dev, value=values[i] * mul / div, kind=kind, tier="core", timestamp=now)
                for metrics in table
                for i, (metric, mul, div, kind) in metrics.items()
            )
        return interpreted(out)
