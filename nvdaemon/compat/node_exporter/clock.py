"""time: ``node_time_seconds``, ``node_time_zone_offset_seconds{time_zone}`` and the clocksources of
``<sys>/devices/system/clocksource/clocksource<N>`` (``node_time_clocksource_{available,current}_info``).

The time and zone are this process's (seconds since the epoch; the zone's offset from UTC in seconds, labelled
with its abbreviation). For the clocksources node_exporter globs ``clocksource[0-9]*`` (sorted by name) and labels
each with its position in that list (``device="0"``), not with the number in its name. A missing clocksource
directory exports no clocksource; an entry without ``available_clocksource`` or ``current_clocksource`` fails the
collector after the time families are out.
"""

from __future__ import annotations

import re
import time

from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.goparse import glob

AVAILABLE_HELP = "Available clocksources read from '/sys/devices/system/clocksource'."
CURRENT_HELP = "Current clocksource read from '/sys/devices/system/clocksource'."
_CLOCKSOURCE = re.compile(r"clocksource[0-9].*", re.DOTALL)


def zone_now() -> tuple[float, str, int]:
    """Seconds since the epoch, the local zone's abbreviation and its offset from UTC in seconds."""
    now = time.time()
    local = time.localtime(now)
    return now, local.tm_zone, local.tm_gmtoff


def read_clocksources(ctx: NodeContext) -> list[tuple[list[str], str]]:
    """(available, current) per clocksource entry, in node_exporter's order."""
    root = ctx.sys()
    if not root.is_dir():  # node_exporter cannot open a sysfs that is not a directory: an error
        raise NotADirectoryError(f"could not read {root}: not a directory")
    out: list[tuple[list[str], str]] = []
    for entry in glob(ctx.sys("devices", "system", "clocksource"), _CLOCKSOURCE):
        available = ctx.read(entry / "available_clocksource")
        current = ctx.read(entry / "current_clocksource")
        out.append((available.split(), current.strip()))
    return out


def collect(ctx: NodeContext, out: list[Family]) -> None:
    now, zone, offset = zone_now()
    out.append(gauge("node_time_seconds", "System time in seconds since epoch (1970).", now))
    out.append(gauge("node_time_zone_offset_seconds", "System time zone offset in seconds.", offset, time_zone=zone))
    sources = read_clocksources(ctx)
    available = Family("node_time_clocksource_available_info", AVAILABLE_HELP, "gauge")
    current = Family("node_time_clocksource_current_info", CURRENT_HELP, "gauge")
    for i, (names, name) in enumerate(sources):
        for cs in names:
            available.add(1.0, device=str(i), clocksource=cs)
        current.add(1.0, device=str(i), clocksource=name)
    out += [available, current]
