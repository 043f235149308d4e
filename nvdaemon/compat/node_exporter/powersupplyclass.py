"""powersupplyclass: ``node_power_supply_*{power_supply}`` and ``node_power_supply_info`` from
``<sys>/class/power_supply/<supply>/``.

Every regular file of a supply directory is read (at most 128 bytes, whitespace trimmed); the attributes procfs
knows are parsed as integers in Go's base-0 syntax, the text ones (type, status, manufacturer...) are kept. Units
as the kernel's power_supply ABI: µA, µV, µW, µWh and µAh are exported divided by 1e6, tenths of a °C divided by
10, percentages, counts and seconds as they are. ``node_power_supply_info`` carries the non-empty text attributes
as labels.

Outcomes, as node_exporter 1.5's: no class/power_supply is ErrNoData (success 0); an attribute that is absent,
or whose read fails with EOPNOTSUPP or EINVAL (a property the device cannot report now), is skipped; any other
read error or a malformed integer fails the whole collector before anything is exported.
``--collector.powersupply.ignored-supplies`` (default ``^$``) has no setting in our config; ``collect_supplies``
takes it for tests.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from nvdaemon.collectors.base import NotPresent
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.compat.node_exporter.hwmon import Families
from nvdaemon.compat.node_exporter.sysfs import sys_read_attr
from nvdaemon.goparse import parse_int

# file -> (metric suffix, divisor). Files parsed by procfs but not exported have no suffix.
INTEGERS: dict[str, tuple[str | None, float]] = {
    **{f: (f, 1.0) for f in ("authentic", "calibrate", "capacity", "capacity_alert_max", "capacity_alert_min")},
    **{"cycle_count": ("cyclecount", 1.0), "online": ("online", 1.0), "present": ("present", 1.0)},
    **{"time_to_empty_now": ("time_to_empty_seconds", 1.0), "time_to_full_now": ("time_to_full_seconds", 1.0)},
    **{f: (f, 1e6) for f in ("current_boot", "current_max", "energy_empty", "energy_empty_design", "energy_full")},
    **{f: (f, 1e6) for f in ("energy_full_design", "voltage_boot", "voltage_max", "voltage_max_design")},
    **{f: (f, 1e6) for f in ("voltage_min", "voltage_min_design", "voltage_ocv", "charge_control_limit")},
    **{f: (f, 1e6) for f in ("charge_control_limit_max", "charge_counter", "charge_empty", "charge_empty_design")},
    **{f: (f, 1e6) for f in ("charge_full", "charge_full_design", "charge_term_current", "constant_charge_current")},
    **{f: (f, 1e6) for f in ("constant_charge_current_max", "constant_charge_voltage", "precharge_current")},
    **{f: (f, 1e6) for f in ("constant_charge_voltage_max", "input_current_limit")},
    **{"current_now": ("current_ampere", 1e6), "energy_now": ("energy_watthour", 1e6)},
    **{"voltage_now": ("voltage_volt", 1e6), "charge_now": ("charge_ampere", 1e6), "power_now": ("power_watt", 1e6)},
    **{f: (f"{f}_celsius", 10.0) for f in ("temp", "temp_alert_max", "temp_alert_min", "temp_ambient")},
    **{f: (f"{f}_celsius", 10.0) for f in ("temp_ambient_max", "temp_ambient_min", "temp_max", "temp_min")},
    **{f: (None, 1.0) for f in ("charge_avg", "current_avg", "energy_avg", "power_avg", "voltage_avg")},
    **{f: (None, 1.0) for f in ("time_to_empty_avg", "time_to_full_avg")},
}
# file -> label of node_power_supply_info
TEXTS = {
    f: f for f in ("capacity_level", "charge_type", "health", "manufacturer", "model_name", "serial_number", "status")
} | {f: f for f in ("technology", "type", "usb_type", "scope")}


def parse_supply(ctx: NodeContext, directory: Path) -> tuple[dict[str, int], dict[str, str]]:
    """(integer attributes, text attributes) of one supply; raises where procfs's parsePowerSupply fails."""
    integers: dict[str, int] = {}
    texts: dict[str, str] = {}
    with os.scandir(directory) as it:
        files = sorted((e.name for e in it if e.is_file(follow_symlinks=False)), key=os.fsencode)
    for name in files:
        try:
            value = sys_read_attr(ctx, directory / name)
        except NotPresent:
            continue
        except OSError as exc:
            # procfs skips EINVAL, and EOPNOTSUPP only as read(2)'s own error (an open error carries the file name)
            if exc.errno == errno.EINVAL or (exc.errno == errno.EOPNOTSUPP and exc.filename is None):
                continue
            raise
        if name in INTEGERS:
            integers[name] = parse_int(value, base=0)
        elif name in TEXTS:
            texts[name] = value
    return integers, texts


def collect_supplies(ctx: NodeContext, out: list[Family], ignored: re.Pattern[str] | None = None) -> None:
    base = ctx.sys("class", "power_supply")
    try:
        names = sorted(os.listdir(base), key=os.fsencode)
    except FileNotFoundError as exc:
        raise NotPresent(str(base)) from exc
    supplies = {name: parse_supply(ctx, base / name) for name in names}  # all parsed before any is exported
    fams = Families()
    for supply, (integers, texts) in supplies.items():
        if ignored is not None and ignored.search(supply):
            continue
        for attr, value in integers.items():
            suffix, divisor = INTEGERS[attr]
            if suffix is None:
                continue
            help = f"{suffix} value of /sys/class/power_supply/<power_supply>."
            shown = value / divisor if divisor != 1.0 else float(value)
            fams.add(f"node_power_supply_{suffix}", help, "gauge", shown, {"power_supply": supply})
        labels = {"power_supply": supply} | {TEXTS[k]: v for k, v in texts.items() if v}
        fams.add("node_power_supply_info", "info of /sys/class/power_supply/<power_supply>.", "gauge", 1.0, labels)
    out.extend(fams.by_name.values())


def collect(ctx: NodeContext, out: list[Family]) -> None:
    collect_supplies(ctx, out)
