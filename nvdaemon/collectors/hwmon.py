"""Hardware sensors from ``<sys>/class/hwmon/hwmon*/``.

Each ``hwmonN`` (in real sysfs a symlink into /sys/devices/...) names its chip in ``name`` and holds one file per
sensor attribute: ``temp1_input`` (millidegrees Celsius), ``temp1_crit`` (m°C), ``fan1_input`` (RPM),
``in0_input`` (millivolts), ``power1_input``/``power1_average`` (microwatts), ``curr1_input`` (milliamps) and
an optional ``<sensor>_label``. Sick I2C/SMBus hardware makes single files fail with EIO, ENODATA or EAGAIN, so
every file is read on its own and a failure costs only that sensor.

Every series is named the Go agent's way: device ``hwmonN/<name file>/<sensor>`` (``hwmon0/coretemp/temp1``,
``hwmon2/nct6775/fan1``), no further labels. ``temp_celsius`` and ``fan_rpm`` are the Go agent's; the rest are ours.
A sensor's ``_label`` text (``Package id 0``) is not a label of those series (that would change the Go series'
identity) but of its own ``hwmon_sensor_info{label}`` series, value 1, same device.

The ``name`` file and the ``_label`` files are set by the driver when the chip is created: they are read once per
chip directory (``StaticAttrs``), where the sensor values are read every tick. A chip directory replaced by another
(a driver reloaded) is a new directory, read afresh in the tick that sees it.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from nvdaemon.collectors.base import (
    Collector,
    Gathered,
    HostRoots,
    Interpreted,
    NotPresent,
    ParseError,
    cycle_listing,
    interpreted,
    read_attr,
)
from nvdaemon.collectors.bounds import label_value
from nvdaemon.collectors.static_attrs import DeviceAttrs, StaticAttrs
from nvdaemon.model import Kind, Sample

Reader = Callable[[str], str]  # a file's text, by its path

_ATTR = re.compile(r"(temp|fan|in|power|curr)([0-9]+)_(input|crit|average|label)", re.ASCII)
_ATTR_LINE = re.compile(r"^(temp|fan|in|power|curr)([0-9]+)_(input|crit|average|label)$", re.ASCII | re.MULTILINE)
_VALUE = re.compile(r"-?[0-9]{1,20}", re.ASCII)  # bounded: int() refuses very long digit strings
_CHIP = re.compile(r"hwmon([0-9]+)", re.ASCII)

# (sensor type, attribute) -> (metric, divisor to the unit in the metric name). Dividing keeps 45000 m°C at
# exactly 45.0, where multiplying by 0.001 would not.
_METRICS: dict[tuple[str, str], tuple[str, int]] = {
    ("temp", "input"): ("temp_celsius", 1000),
    ("temp", "crit"): ("temp_crit_celsius", 1000),
    ("fan", "input"): ("fan_rpm", 1),
    ("in", "input"): ("voltage_volts", 1000),
    ("power", "input"): ("power_watts", 1_000_000),
    ("power", "average"): ("power_watts", 1_000_000),  # used only when there is no power<N>_input
    ("curr", "input"): ("current_amps", 1000),
}
_DIVISORS = dict(_METRICS.values())


@dataclass(frozen=True)
class Reading:
    chip: str  # the hwmonN directory name
    chip_name: str  # contents of its ``name`` file
    sensor: str  # e.g. "temp1"
    metric: str
    raw: int  # as the kernel reports it (milli/micro units)
    label: str = ""  # contents of the sensor's ``_label`` file, if any

    @property
    def device(self) -> str:
        return f"{self.chip}/{self.chip_name}/{self.sensor}"


def parse_sensor_value(text: str) -> int:
    """One hwmon attribute: a signed decimal integer and a newline."""
    value = text.strip()
    if not _VALUE.fullmatch(value):
        raise ParseError(f"not an integer: {value[:40]!r}")
    return int(value)


def _describe(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# Paths are plain strings here: a chip has dozens of files, and building a Path for each cost more CPU than
# reading it.


def _present(chip: DeviceAttrs, name: str, read: Reader) -> str:
    """``chip.read`` of an attribute the listing showed: ``NotPresent`` if it went since."""
    text = chip.read(name, read)
    if text is None:
        raise NotPresent(f"{chip.directory}/{name}")
    return text


def _chip_name(chip: DeviceAttrs, read: Reader, problems: list[tuple[str, Exception]]) -> str:
    """The chip's ``name`` (in the hwmon directory, or in ``device/`` for drivers of the older layout)."""
    directory = os.path.basename(chip.directory)
    for where in ("", "device/"):
        try:
            text = chip.read(f"{where}name", read)
            if text is None:
                continue
            return label_value(text.strip(), "chip name") or directory
        except (OSError, ParseError) as exc:
            problems.append((f"{chip.directory}/{where}name", exc))
            break
    return directory


def _sensor_files(where: str, optional: bool) -> dict[tuple[str, str], set[str]]:
    """(type, number) -> attributes of the sensor files in a directory; an ``optional`` directory that is missing (or
    not a directory) has none."""
    try:
        names = [name for name, _ in cycle_listing(where)]  # the node_* surface's hwmon lists the same directories
    except (FileNotFoundError, NotADirectoryError):
        if optional:
            return {}
        raise
    found: dict[tuple[str, str], set[str]] = {}
    joined = "\n".join(names)
    # One scan of the joined listing instead of a regex call per entry (a device directory has dozens of entries,
    # few of them sensors); a name with a newline in it (never in sysfs) takes the per-entry way.
    if joined.count("\n") == len(names) - 1:
        matches = _ATTR_LINE.finditer(joined)
    else:
        matches = (m for m in map(_ATTR.fullmatch, names) if m)
    for m in matches:
        found.setdefault((m.group(1), m.group(2)), set()).add(m.group(3))
    return found


def read_chip(chip: str, read: Reader, fixed: StaticAttrs, problems: list[tuple[str, Exception]]) -> list[Reading]:
    """All readable sensors of one chip directory; each failure is appended to ``problems`` as (path, error).

    Older drivers (ACPI power_meter, some SuperIO chips) keep ``name`` and the sensor files in the parent
    device's directory (``hwmonN/device/``); a sensor found in both places is read from the hwmon directory.
    ``fixed`` keeps the chip's fixed attributes across ticks.
    """
    try:
        chip_attrs = fixed.device(chip)
    except NotPresent as exc:  # the chip went: an error of this chip, as its listing would fail
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), chip) from exc
    name = _chip_name(chip_attrs, read, problems)
    chip_dir = os.path.basename(chip)
    sensors: dict[tuple[str, str], set[str]] = {}
    home: dict[tuple[str, str], str] = {}  # where the sensor's files are, relative to the chip: "" or "device/"
    for where in ("", "device/"):
        for key, found in _sensor_files(f"{chip}/{where}" if where else chip, optional=bool(where)).items():
            if key not in sensors:
                sensors[key], home[key] = found, where
    readings: list[Reading] = []
    for (kind, num), attrs in sorted(sensors.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
        sensor = f"{kind}{num}"
        where = home[kind, num]
        stem = f"{chip}/{where}{sensor}_"
        label = ""
        if "label" in attrs:
            try:
                label = label_value(_present(chip_attrs, f"{where}{sensor}_label", read).strip(), "sensor label")
            except (OSError, NotPresent, ParseError) as exc:
                problems.append((f"{stem}label", exc))
        wanted = [a for a in ("input", "crit", "average") if a in attrs and (kind, a) in _METRICS]
        if kind == "power" and "input" in wanted and "average" in wanted:
            wanted.remove("average")
        for attr in wanted:
            path = f"{stem}{attr}"
            try:
                raw = parse_sensor_value(read(path))
            except (OSError, NotPresent, ParseError) as exc:
                problems.append((path, exc))
                continue
            readings.append(Reading(chip_dir, name, sensor, _METRICS[kind, attr][0], raw, label))
    return readings


def _chip_order(name: str) -> tuple[int, str]:
    m = _CHIP.fullmatch(name)
    return (int(m.group(1)) if m else -1, name)


class HwmonCollector(Collector):
    name = "hwmon"
    tier = "core"

    def __init__(self, read: Reader = read_attr) -> None:
        self._read = read  # injectable so tests can simulate EIO, which root can not get from a mode-000 file
        # The chips' name and label files, kept per collector as they are read through its reader (a reader that
        # fails them must see them read): 1.0 -> 0.8 ms CPU a tick on gpunode.
        self._fixed = StaticAttrs()

    def present(self, roots: HostRoots) -> bool:
        """Whether the node has a hwmon chip: a listing of the class directory, which asks no driver."""
        try:
            return any(_CHIP.fullmatch(n) for n in os.listdir(roots.sys / "class" / "hwmon"))
        except (FileNotFoundError, NotADirectoryError):
            return False

    def gather(self, roots: HostRoots) -> Gathered:
        base = roots.sys / "class" / "hwmon"
        try:
            names = sorted((n for n in os.listdir(base) if _CHIP.fullmatch(n)), key=_chip_order)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotPresent(str(base)) from exc
        if not names:
            raise NotPresent(f"{base}: no hwmon chips")
        problems: list[tuple[str, Exception]] = []
        readings: list[Reading] = []
        for chip in (f"{base}/{n}" for n in names):
            try:
                readings.extend(read_chip(chip, self._read, self._fixed, problems))
            except OSError as exc:  # the directory itself vanished or can not be listed
                problems.append((chip, exc))
        if problems and not readings:
            raise problems[0][1]
        return Gathered(readings, errors=[f"{path}: {_describe(exc)}" for path, exc in problems])

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        readings: list[Reading] = gathered.data
        out = [
            Sample(metric=r.metric, device=r.device, value=r.raw / _DIVISORS[r.metric], tier="core", timestamp=now)
            for r in readings
        ]
        labelled = {r.device: r.label for r in readings if r.label}
        out.extend(
            Sample("hwmon_sensor_info", device, 1.0, Kind.GAUGE, (("label", label),), "core", now)
            for device, label in labelled.items()
        )
        return interpreted(out)
