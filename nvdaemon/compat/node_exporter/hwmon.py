"""hwmon: node_exporter's ``node_hwmon_*`` families from ``<sys>/class/hwmon/hwmon*`` (and each chip's ``device``).

Every file of a chip directory named ``<type><n>_<property>`` (``temp1_input``, ``fan2_min``, ``in3_label``) with a
known type (temp, in, cpu, fan, pwm, curr, power, energy, humidity, intrusion, vrm, beep_enable, update_interval)
becomes a series ``node_hwmon_<type>[_<property>]<unit>{chip,sensor}``; the files of the chip's ``device``
directory are read the same way (old drivers such as ACPI's power_meter keep their attributes there). Units follow
node_exporter: temperatures m°C -> °C, voltages and currents milli -> base, power and energy µ -> base, intervals
ms -> s, fan speeds stay RPM; properties it has no unit for are exported raw. A file that cannot be read or is not
a Go float is skipped. The ``chip`` label comes from the resolved ``device`` link (``platform_coretemp_0``), else
from the ``name`` file, else from the directory; ``node_hwmon_chip_names`` maps it to the ``name`` file.

What a chip's driver sets once, when the hwmon device is created, is read once per chip directory through
``StaticAttrs``: the ``name`` file, every sensor's ``*_label`` and the chip label derived from the ``device`` link.
Sensor values and what an administrator writes (``*_max``, ``*_min``, ``*_crit``, ``*_beep``, ``pwm*``,
``update_interval``) are read every scrape. A chip directory replaced by another (a driver reloaded, a hot-plugged
device) is a new directory, read afresh.

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

from nvdaemon.collectors.base import NotPresent, ParseError, cycle_listing, cycle_stat
from nvdaemon.collectors.static_attrs import DeviceAttrs, StaticAttrs
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType
from nvdaemon.compat.node_exporter.options import compile_filter, filtered_out
from nvdaemon.compat.node_exporter.sysfs import SYSFS_READ_MAX, sys_read_file
from nvdaemon.goparse import parse_float_or_none


class Families:
    """Families in first-seen order; a sample whose HELP or type differs from its family's is dropped, as the Go
    registry refuses it (the rest of the scrape is still served)."""

    def __init__(self) -> None:
        self.by_name: dict[str, Family] = {}

    def add(self, name: str, help: str, kind: FamilyType, value: float, labels: dict[str, str]) -> None:
        fam = self.by_name.get(name)
        if fam is None:  # not setdefault: that built a Family for every sample (172 a scrape on gpunode)
            fam = self.by_name[name] = Family(name, help, kind)
        if fam.help == help and fam.type == kind:
            fam.add(value, labels)


_INVALID = re.compile(r"[^a-z0-9:_]", re.ASCII)
_FILENAME = re.compile(r"(?P<type>[^0-9]+)(?P<id>[0-9]*)?(_(?P<property>.+))?")
SENSOR_TYPES = frozenset(
    {"vrm", "beep_enable", "update_interval", "in", "cpu", "fan", "pwm", "temp", "curr", "power", "energy"}
    | {"humidity", "intrusion"}
)
ChipFilter = tuple[re.Pattern[str] | None, re.Pattern[str] | None]  # include, exclude
SensorData = dict[str, dict[str, str]]  # sensor ("temp1") -> property ("input", "" for a bare "temp1") -> text
# Anchored at class/hwmon/hwmonN (followed to the chip's directory). With the changes below, a gpunode scrape went
# from 2.9 to 2.1 ms CPU: 39 of its 191 file reads, 15 failed reads of power/ and a realpath per chip fewer.
CHIPS = StaticAttrs()
# Where the chip label derived from the ``device`` link is kept among the chip's fixed attributes: no file name
# holds a NUL, so no attribute can take its place.
_DEVICE_LABEL = "\0device label"
_PLAN = "sensor plan "  # + "" or "device/": a key of DeviceAttrs.derived


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


def _first_read(text: str) -> str:
    """``sys_read_file``'s cut of a text read whole: its first 128 bytes."""
    if len(text) <= SYSFS_READ_MAX // 4:  # at most 4 bytes a character: within the buffer without encoding it
        return text
    raw = text.encode()
    return raw[:SYSFS_READ_MAX].decode(errors="replace") if len(raw) > SYSFS_READ_MAX else text


# A chip directory's sensor files, in the order node_exporter reads them: (what to read, the sensor, the property).
# What to read is the file's path, or for a label its name under the chip (read once, as a fixed attribute).
SensorPlan = tuple[tuple[str, str, str], ...]


def sensor_plan(directory: str, subdir: str, listing: list[tuple[str, bool]]) -> SensorPlan:
    """The sensor files of ``listing`` (``cycle_listing(directory)``), ``subdir`` "" or "device/"."""
    # A directory (power/) is skipped from the listing's file type: reading it failed, at ~15 exceptions per scrape
    # on gpunode. A symlink is read as before.
    names = [name for name, is_dir in listing if not is_dir]
    plan: list[tuple[str, str, str]] = []
    # Byte order, as Go lists a directory; for ASCII names (all of sysfs's) that is the str order, without encoding
    # every name for the key.
    for filename in sorted(names) if "".join(names).isascii() else sorted(names, key=os.fsencode):
        parts = explode_filename(filename)
        if parts is None or parts[0] not in SENSOR_TYPES:
            continue
        kind, num, prop = parts
        where = f"{subdir}{filename}" if prop == "label" else f"{directory}/{filename}"
        plan.append((where, f"{kind}{num}", prop))
    return tuple(plan)


def collect_sensor_data(ctx: NodeContext, chip: DeviceAttrs, subdir: str, data: SensorData) -> None:
    """The sensor files of the chip's directory (``subdir`` "") or of its ``device/`` ("device/")."""
    # No trailing slash: a file's path is also the cycle's cache key, and the nodevitals_hw_* hwmon collector reads
    # the same files as "<chip>/device/<file>".
    directory = f"{chip.directory}/{subdir.rstrip('/')}" if subdir else chip.directory
    # An unreadable directory fails the chip. Listed once a cycle for both hwmon collectors (cycle_listing); the
    # plan is made again only when the listing differs from the one it was made from (a sensor file added or
    # gone), which a chip's directory of a running driver never does (this collector on gpunode: 0.95-0.99 ->
    # 0.85-0.89 ms a scrape).
    listing = cycle_listing(directory)
    key = _PLAN + subdir
    kept = chip.derived.get(key)
    if kept is not None and kept[0] == listing:
        plan: SensorPlan = kept[1]
    else:
        plan = sensor_plan(directory, subdir, listing)
        chip.derived[key] = (listing, plan)
    for where, sensor, prop in plan:
        try:
            if prop == "label":  # fixed by the driver: read once per chip directory
                label = chip.read(where)
                if label is None:
                    continue
                text = _first_read(label)
            else:
                text = sys_read_file(ctx, where)  # a string: the cache's key, no Path per file
        except (OSError, NotPresent):
            continue  # sick hardware (EIO, EAGAIN) or a file that went: only this file is lost
        data.setdefault(sensor, {})[prop] = text.strip("\n")


def _device_label(directory: str) -> str | None:
    """ "<parent dir>_<device dir>" of the resolved ``device`` link ("" when there is none, or it names nothing);
    None when resolving it failed otherwise (not remembered)."""
    try:
        device = os.path.realpath(f"{directory}/device", strict=True)
    except FileNotFoundError:
        return ""
    except OSError:
        return None
    prefix, dev_name = os.path.split(device)
    dev_type, dev_name = clean_name(os.path.basename(prefix.rstrip("/"))), clean_name(dev_name)
    if dev_type and dev_name:
        return f"{dev_type}_{dev_name}"
    return dev_name


def _name(chip: DeviceAttrs) -> str:
    """The chip's ``name`` file, cleaned; "" when it is absent or unreadable."""
    try:
        return clean_name(chip.read("name") or "")
    except OSError:
        return ""


def chip_label(chip: DeviceAttrs) -> str:
    """node_exporter's hwmonName: "<parent dir>_<device dir>" of the resolved device, else name, else hwmonN."""
    label = chip.values.get(_DEVICE_LABEL)
    if label is None:
        # realpath costs a handful of lstat/readlink calls per chip (an eighth of this collector's CPU on
        # gpunode), and the link is fixed for the chip's life.
        label = _device_label(chip.directory)
        if label is not None:
            chip.values[_DEVICE_LABEL] = label
    if label:
        return label
    name = _name(chip)
    if name:
        return name
    name = clean_name(os.path.basename(os.path.realpath(chip.directory, strict=True)))
    if not name:
        raise ParseError(f"Could not derive a monitoring name for {chip.directory}")
    return name


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


@functools.lru_cache(maxsize=1024)  # a pure function of a few hundred (type, property) pairs at most
def _series(kind: str, element: str, bare: bool) -> tuple[str, str, FamilyType, float, bool]:
    """(family name, HELP, type, factor, divide) of one property of a sensor; ``bare``: the sensor has a file with
    no property too ("temp1" beside "temp1_input"). Cached: naming a family per sample cost 0.1 ms a scrape."""
    name = f"node_hwmon_{kind}"
    if element == "input":
        name += "_input" if bare else ""  # with a bare "temp1" too, "temp1_input" keeps its suffix
    elif element:
        name += "_" + clean_name(element)
    unit = _unit(kind, element, name)
    if unit is None:  # exported raw (times 1.0: the same float)
        return name, f"Hardware monitor {kind} element {element}", "gauge", 1.0, False
    return unit


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
    bare = "" in values
    for element, text in values.items():
        if element == "label":
            continue
        value = parse_float_or_none(text)
        if value is None:
            continue
        family, help, ftype, factor, divide = _series(kind, element, bare)
        fams.add(family, help, ftype, value / factor if divide else value * factor, labels)


def update_chip(ctx: NodeContext, directory: str, fams: Families, chip_filter: ChipFilter = (None, None)) -> None:
    """One chip; an exception means node_exporter's updateHwmon failed (nothing of this chip is exported)."""
    chip = CHIPS.device(directory)
    label = chip_label(chip)
    if filtered_out(label, *chip_filter):
        return  # node_exporter >= 1.7's --collector.hwmon.chip-include/-exclude (1.5.0 has no such flags)
    data: SensorData = {}
    collect_sensor_data(ctx, chip, "", data)
    if _exists(f"{directory}/device"):
        collect_sensor_data(ctx, chip, "device/", data)
    chip_name = _name(chip)
    if chip_name:
        help = "Annotation metric for human-readable chip names"
        fams.add("node_hwmon_chip_names", help, "gauge", 1.0, {"chip": label, "chip_name": chip_name})
    for sensor, values in data.items():
        emit_sensor(fams, label, sensor, values)


# The errors pathlib's is_dir/is_symlink answer False for; any other (EACCES, EIO) fails the collector.
_ABSENT_ERRNOS = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})


def _exists(path: str) -> bool:
    """``os.path.exists``, through the cycle's stats."""
    try:
        cycle_stat(path)
    except (OSError, ValueError):
        return False
    return True


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
    options = ctx.options.hwmon
    chip_filter = compile_filter(options.chip_include), compile_filter(options.chip_exclude)
    # node_exporter 1.5 keeps one error variable that the os.Stat of every symlinked entry overwrites: a chip's
    # failure is forgotten when a later symlink resolves, and a dangling symlink fails the collector unless a
    # later one resolves. Fixed upstream in 1.7; reproduced here.
    error: Exception | None = None
    for entry in entries:
        path = f"{base}/{entry}"
        if _is_kind(os.lstat, path, stat.S_ISLNK):
            try:
                cycle_stat(path)  # the chip's directory: its is_dir below and its fixed attributes stat it again
                error = None
            except OSError as exc:
                error = exc
                continue
        if not _is_kind(cycle_stat, path, stat.S_ISDIR):
            continue
        try:
            update_chip(ctx, path, fams, chip_filter)
        except Exception as exc:  # node_exporter goes on with the next chip
            error = exc
    out.extend(fams.by_name.values())
    if error is not None:
        raise error
