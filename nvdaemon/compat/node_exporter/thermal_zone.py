"""thermal_zone: ``node_thermal_zone_temp`` and ``node_cooling_device_{cur,max}_state`` from ``<sys>/class/thermal``.

Each ``thermal_zone<N>`` has ``type`` and ``policy`` (text), ``temp`` (millidegrees Celsius, exported in °C), and
optionally ``mode`` (enabled/disabled) and ``passive`` (m°C); each ``cooling_device<N>`` has ``type``,
``cur_state`` and ``max_state`` (plain integers; ``cur_state`` is -1 for an idle intel_powerclamp).

Outcomes follow procfs and node_exporter: a zone whose read fails with ENODATA (a sensor not ready) is skipped;
any other failure of a zone (a required file missing, a malformed number) fails the collector before any zone is
exported; a failing cooling device fails it after the zone temperatures were exported. Without /sys/class/thermal
the collector succeeds with nothing.
"""

from __future__ import annotations

import contextlib
import errno
import re
from dataclasses import dataclass
from pathlib import Path

from nvdaemon.collectors.base import NotPresent
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.compat.node_exporter.sysfs import read_int_file, sys_read_attr
from nvdaemon.goparse import glob, parse_int

_ZONE = re.compile(r"thermal_zone[0-9].*", re.DOTALL)
_COOLING = re.compile(r"cooling_device[0-9].*", re.DOTALL)


@dataclass(frozen=True)
class Zone:
    name: str  # the directory name less "thermal_zone"
    type: str
    temp: int  # m°C


@dataclass(frozen=True)
class CoolingDevice:
    name: str  # the directory name less "cooling_device"
    type: str
    cur_state: int
    max_state: int


def read_zone(ctx: NodeContext, path: Path) -> Zone:
    zone_type = sys_read_attr(ctx, path / "type")
    sys_read_attr(ctx, path / "policy")  # required by procfs, though not exported
    temp = read_int_file(ctx, path / "temp", signed=True)
    # Optional: absent or forbidden is fine, any other failure is one of the zone; passive must be unsigned.
    with contextlib.suppress(NotPresent, PermissionError):
        sys_read_attr(ctx, path / "mode")
    with contextlib.suppress(NotPresent, PermissionError):
        read_int_file(ctx, path / "passive")
    return Zone(path.name.removeprefix("thermal_zone"), zone_type, temp)


def read_cooling_device(ctx: NodeContext, path: Path) -> CoolingDevice:
    cd_type = sys_read_attr(ctx, path / "type")
    max_state = parse_int(sys_read_attr(ctx, path / "max_state"))
    cur_state = parse_int(sys_read_attr(ctx, path / "cur_state"))
    return CoolingDevice(path.name.removeprefix("cooling_device"), cd_type, cur_state, max_state)


def read_zones(ctx: NodeContext) -> list[Zone]:
    zones: list[Zone] = []
    for path in glob(ctx.sys("class", "thermal"), _ZONE):
        try:
            zones.append(read_zone(ctx, path))
        except OSError as exc:
            if exc.errno == errno.ENODATA:  # e.g. a zone of a device that is powered down
                continue
            raise
    return zones


def collect(ctx: NodeContext, out: list[Family]) -> None:
    zones = read_zones(ctx)
    temp = gauge("node_thermal_zone_temp", "Zone temperature in Celsius")
    for z in zones:
        temp.add(z.temp / 1000.0, zone=z.name, type=z.type)
    out.append(temp)
    # Every cooling device is read before any is exported: one bad device hides them all.
    devices = [read_cooling_device(ctx, p) for p in glob(ctx.sys("class", "thermal"), _COOLING)]
    cur = gauge("node_cooling_device_cur_state", "Current throttle state of the cooling device")
    top = gauge("node_cooling_device_max_state", "Maximum throttle state of the cooling device")
    for d in devices:
        cur.add(d.cur_state, name=d.name, type=d.type)
        top.add(d.max_state, name=d.name, type=d.type)
    out += [cur, top]
