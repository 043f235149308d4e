"""hwmon: node_exporter's ``node_hwmon_*`` families from ``<sys>/class/hwmon/hwmon*`` (and each chip's ``device``).

Every file of a chip directory named ``<type><n>_<property>`` (``temp1_input``, ``fan2_min``, ``in3_label``) with a
known type (temp, in, cpu, fan, pwm, curr, power, energy, humidity, intrusion, vrm, beep_enable, update_interval)
becomes a series ``node_hwmon_<type>[_<property>]<unit>{chip,sensor}``; the files of the chip's ``device``
directory are read the same way (old drivers such as ACPI's power_meter keep their attributes there). Units follow
node_exporter: temperatures m°C -> °C, voltages and currents milli -> base, power and energy µ -> base, intervals
ms -> s, fan speeds stay RPM; properties it has no unit for are exported raw. A file that cannot be read or is not
a Go float is skipped. The ``chip`` label comes from the resolved ``device`` link (``platform_coretemp_0``), else
from the ``name`` file, else from the directory; ``node_hwmon_chip_names`` maps it to the ``name`` file.

The registry's help check (``Families``) is shared with rapl and powersupplyclass; the sysfs reads are in
``sysfs`` and Go's parsers in ``goparse``.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
from collections.abc import Callable

from nvdaemon.collectors.base import NotPresent, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType
from nvdaemon.compat.node_exporter.options import compile_filter, filtered_out
from nvdaemon.compat.node_exporter.sysfs import sys_read_file
from nvdaemon.goparse import parse_float_or_none


class Families:
    """Families in first-seen order; a sample whose HELP or type differs from its family's is dropped, as the Go
    registry refuses it (the rest of the scrape is still served)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Family] = {}

    def add(self, name: str, help: str, kind: FamilyType, value: float, labels: dict[str, str]) -> None:
        fam = self.by_name.setdefault(name, Family(name, help, kind))
        if fam.help == help and fam.type == kind:
            fam.add(value, labels)


_INVALID = re.compile(r"[^a-z0-9:_]", re.ASCII)
_FILENAME = re.compile(r"(?P<type>[^0-9]+)(?P<id>[0-9]*)?(_(?P<property>.+))?")
SENSOR_TYPES = frozenset(
    {"vrm", "beep_enable", "update_interval", "in", "cpu", "fan", "pwm", "temp", "curr", "power", "energy"}
    | {"humidity", "intrusion"}
)
SensorData = dict[str, dict[str, str]]  # sensor ("temp1") -> property ("input", "" for a bare "temp1") -> text


def clean_name(name: str) -> str:
    """node_exporter's cleanMetricName: lower case, [^a-z0-9:_] -> "_", outer "_" trimmed."""
    return _INVALID.sub("_", name.lower()).strip("_")


@functools.lru_cache(maxsize=2048)  # a host's sensor file names repeat every cycle; a miss only costs the regex
def explode_filename(filename: str) -> tuple[str, int, str] | None:
    """``temp1_crit_alarm`` -> ("temp", 1, "crit_alarm"); ``None`` when the name is no sensor file."""
    m = _FILENAME.fullmatch(filename)
    if m is None:
        return None
    num = m.group("id") or "0"
    if len(num) > 19 or int(num) >= 1 << 63:  # strconv.Atoi overflow
        return None
    return m.group("type"), int(num), m.group("property") or ""


def collect_sensor_data(ctx: NodeContext, directory: str, data: SensorData) -> None:
    for filename in sorted(os.listdir(directory), key=os.fsencode):  # an unreadable directory fails the chip
        parts = explode_filename(filename)
        if parts is None or parts[0] not in SENSOR_TYPES:
            continue
        kind, num, prop = parts
        try:
            text = sys_read_file(ctx, f"{directory}/{filename}")  # a string: the cache's key, no Path per file
        except (OSError, NotPresent):
            continue  # sick hardware (EIO, EAGAIN) or a directory such as power/: only this file is lost
        data.setdefault(f"{kind}{num}", {})[prop] = text.strip("\n")


def chip_label(ctx: NodeContext, directory: str) -> str:
    """node_exporter's hwmonName: "<parent dir>_<device dir>" of the resolved device, else name, else hwmonN."""
    try:
        device = os.path.realpath(f"{directory}/device", strict=True)
    except OSError:
        device = ""
    if device:
        prefix, dev_name = os.path.split(device)
        dev_type, dev_name = clean_name(os.path.basename(prefix.rstrip("/"))), clean_name(dev_name)
        if dev_type and dev_name:
            return f"{dev_type}_{dev_name}"
        if dev_name:
            return dev_name
    try:
        name = clean_name(ctx.read(f"{directory}/name"))
    except (OSError, NotPresent):
        name = ""
    if name:
        return name
    name = clean_name(os.path.basename(os.path.realpath(directory, strict=True)))
    if not name:
        raise ParseError(f"Could not derive a monitoring name for {directory}")
    return name


@functools.lru_cache(maxsize=1024)  # a pure function of a few hundred (type, property) pairs at most
def _unit(kind: str, element: str, name: str) -> tuple[str, str, FamilyType, float, bool] | None:
    """(family name, HELP, type, factor, divide) of one property, or ``None`` for the raw fallback."""
    if element in ("fault", "alarm"):
        return name, f"Hardware sensor {element} status ({kind})", "gauge", 1.0, False
    if element == "beep":
        return name + "_enabled", "Hardware monitor sensor has beeping enabled", "gauge", 1.0, False
    if kind in ("in", "cpu"):
        return name + "_volts", f"Hardware monitor for voltage ({element})", "gauge", 0.001, False
    if kind == "temp" and element != "type":
        what = element or "input"
        return name + "_celsius", f"Hardware monitor for temperature ({what})", "gauge", 0.001, False
    if kind == "curr":
        return name + "_amps", f"Hardware monitor for current ({element})", "gauge", 0.001, False
    if kind == "energy":
        help = f"Hardware monitor for joules used so far ({element})"
        return name + "_joule_total", help, "counter", 1000000.0, True
    if kind == "power" and element == "accuracy":
        return name, "Hardware monitor power meter accuracy, as a ratio", "gauge", 1000000.0, True
    if kind == "power" and element in ("average_interval", "average_interval_min", "average_interval_max"):
        return name + "_seconds", f"Hardware monitor power usage update interval ({element})", "gauge", 0.001, False
    if kind == "power":
        return name + "_watt", f"Hardware monitor for power usage in watts ({element})", "gauge", 1000000.0, True
    if kind == "humidity":
        help = "Hardware monitor for humidity, as a ratio (multiply with 100.0 to get the humidity as a percentage)"
        return name, f"{help} ({element})", "gauge", 1000000.0, True
    if kind == "fan" and element in ("input", "min", "max", "target"):
        return name + "_rpm", f"Hardware monitor for fan revolutions per minute ({element})", "gauge", 1.0, False
    return None


def emit_sensor(fams: Families, chip: str, sensor: str, values: dict[str, str]) -> None:
    labels = {"chip": chip, "sensor": sensor}
    kind = sensor.rstrip("0123456789")  # the key is "<type><n>" and a type has no digit
    if "label" in values:
        label = {**labels, "label": values["label"]}
        fams.add("node_hwmon_sensor_label", "Label for given chip and sensor", "gauge", 1.0, label)
    if kind == "beep_enable":
        enabled = 1.0 if values.get("") == "1" else 0.0
        fams.add("node_hwmon_beep_enabled", "Hardware beep enabled", "gauge", enabled, labels)
        return
    if kind in ("vrm", "update_interval"):
        value = parse_float_or_none(values.get("", ""))
        if value is not None and kind == "vrm":
            fams.add("node_hwmon_voltage_regulator_version", "Hardware voltage regulator", "gauge", value, labels)
        elif value is not None:
            help = "Hardware monitor update interval"
            fams.add("node_hwmon_update_interval_seconds", help, "gauge", value * 0.001, labels)
        return
    for element, text in values.items():
        if element == "label":
            continue
        name = f"node_hwmon_{kind}"
        if element == "input":
            name += "_input" if "" in values else ""  # with a bare "temp1" too, "temp1_input" keeps its suffix
        elif element:
            name += "_" + clean_name(element)
        value = parse_float_or_none(text)
        if value is None:
            continue
        unit = _unit(kind, element, name)
        if unit is None:
            fams.add(name, f"Hardware monitor {kind} element {element}", "gauge", value, labels)
            continue
        family, help, ftype, factor, divide = unit
        fams.add(family, help, ftype, value / factor if divide else value * factor, labels)


def update_chip(ctx: NodeContext, directory: str, fams: Families) -> None:
    """One chip; an exception means node_exporter's updateHwmon failed (nothing of this chip is exported)."""
    chip = chip_label(ctx, directory)
    include, exclude = compile_filter(ctx.options.hwmon.chip_include), compile_filter(ctx.options.hwmon.chip_exclude)
    if filtered_out(chip, include, exclude):
        return  # node_exporter >= 1.7's --collector.hwmon.chip-include/-exclude (1.5.0 has no such flags)
    data: SensorData = {}
    collect_sensor_data(ctx, directory, data)
    if os.path.exists(f"{directory}/device"):
        collect_sensor_data(ctx, f"{directory}/device", data)
    try:
        chip_name = clean_name(ctx.read(f"{directory}/name"))
    except (OSError, NotPresent):
        chip_name = ""
    if chip_name:
        help = "Annotation metric for human-readable chip names"
        fams.add("node_hwmon_chip_names", help, "gauge", 1.0, {"chip": chip, "chip_name": chip_name})
    for sensor, values in data.items():
        emit_sensor(fams, chip, sensor, values)


# The errors pathlib's is_dir/is_symlink answer False for; any other (EACCES, EIO) fails the collector.
_ABSENT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def _is_kind(stat_fn: Callable[[str], os.stat_result], path: str, test: Callable[[int], bool]) -> bool:
    """pathlib's ``is_symlink``/``is_dir`` on a string path (no Path object built per entry)."""
    try:
        return test(stat_fn(path).st_mode)
    except OSError as exc:
        if exc.errno in _ABSENT_ERRNOS:
            return False
        raise


def collect(ctx: NodeContext, out: list[Family]) -> None:
    base = ctx.sys("class", "hwmon")
    try:
        entries = sorted(os.listdir(base), key=os.fsencode)
    except FileNotFoundError as exc:
        raise NotPresent(str(base)) from exc
    fams = Families()
    # node_exporter 1.5 keeps one error variable that the os.Stat of every symlinked entry overwrites: a chip's
    # failure is forgotten when a later symlink resolves, and a dangling symlink fails the collector unless a
    # later one resolves. Fixed upstream in 1.7; reproduced here.
    error: Exception | None = None
    for entry in entries:
        path = f"{base}/{entry}"
        if _is_kind(os.lstat, path, stat.S_ISLNK):
            try:
                os.stat(path)
                error = None
            except OSError as exc:
                error = exc
                continue
        if not _is_kind(os.stat, path, stat.S_ISDIR):
            continue
        try:
            update_chip(ctx, path, fams)
        except Exception as exc:  # node_exporter goes on with the next chip
            error = exc
    out.extend(fams.by_name.values())
    if error is not None:
        raise error
