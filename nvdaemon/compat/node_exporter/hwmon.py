"""hwmon: node_exporter's ``node_hwmon_*`` families from ``<sys>/class/hwmon/hwmon*`` (and each chip's ``device``).

Every file of a chip directory named ``<type><n>_<property>`` (``temp1_input``, ``fan2_min``, ``in3_label``) with a
known type (temp, in, cpu, fan, pwm, curr, power, energy, humidity, intrusion, vrm, beep_enable, update_interval)
becomes a series ``node_hwmon_<type>[_<property>]<unit>{chip,sensor}``; the files of the chip's ``device``
directory are read the same way (old drivers such as ACPI's power_meter keep their attributes there). Units follow
node_exporter: temperatures m°C -> °C, voltages and currents milli -> base, power and energy µ -> base, intervals
ms -> s, fan speeds stay RPM; properties it has no unit for are exported raw. A file that cannot be read or is not
a Go float is skipped. The ``chip`` label comes from the resolved ``device`` link (``platform_coretemp_0``), else
from the ``name`` file, else from the directory; ``node_hwmon_chip_names`` maps it to the ``name`` file.

The Go helpers below (TrimSpace, ParseInt/ParseUint/ParseFloat, 128-byte sysfs reads, Glob, the registry's help
check) are shared with the other sensor-group collectors: thermal_zone, rapl, edac and powersupplyclass.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from nvdaemon.collectors.base import NotPresent, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType
from nvdaemon.compat.node_exporter.options import compile_filter

# Go's unicode.IsSpace: Python's str.isspace() set less the four ASCII separators \x1c-\x1f.
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
_HEX_FLOAT = re.compile(r"[+-]?0[xX]([0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+", re.ASCII)
_INF = re.compile(r"[+-]?(inf|infinity)", re.ASCII | re.IGNORECASE)
_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdef"}


def go_trim_space(text: str) -> str:
    return text.strip(GO_SPACE)


def parse_go_float(text: str) -> float | None:
    """``strconv.ParseFloat(text, 64)``; ``None`` where Go errs (surrounding space, finite overflow...)."""
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    if text.lower() == "nan":  # Go takes no sign on NaN
        return math.nan
    if "_" in text:  # Go's float literal syntax: "_" between digits ("1_000.5"), a base prefix counting as one
        body = text[1:] if text[:1] in ("+", "-") else text
        hexadecimal = body[:2].lower() == "0x"
        if not _underscores_ok(body[2:] if hexadecimal else body, hexadecimal, hexadecimal):
            return None
        text = text.replace("_", "")
    if _DECIMAL.fullmatch(text):
        value = float(text)
    elif _HEX_FLOAT.fullmatch(text):
        value = float.fromhex(text)
    else:
        return None
    return None if math.isinf(value) else value


def _underscores_ok(body: str, prefixed: bool, hexadecimal: bool) -> bool:
    # Go's underscoreOK: "_" only between digits, where a base prefix counts as a digit.
    saw = "0" if prefixed else "^"
    for ch in body:
        if ch in "0123456789" or (hexadecimal and ch.lower() in "abcdef"):
            saw = "0"
        elif ch == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
    return saw != "_"


def parse_go_int(text: str, base0: bool = False, signed: bool = True) -> int:
    """``strconv.ParseInt(text, 10 or 0, 64)`` (``signed``) or ``ParseUint``; raises ``ParseError`` where Go errs.

    With ``base0`` the prefix picks the base as in Go (0x, 0o, 0b, and a bare leading 0 for octal) and ``_``
    may separate digits.
    """
    sign, body = (text[0], text[1:]) if text[:1] in ("+", "-") else ("", text)
    if sign and not signed:
        raise ParseError(f"not an unsigned integer: {text[:40]!r}")
    base, digits, prefixed = 10, body, False
    if base0 and len(body) >= 2 and body[0] == "0" and body[1].lower() in "xob":
        base, digits, prefixed = {"x": 16, "o": 8, "b": 2}[body[1].lower()], body[2:], True
    elif base0 and len(body) >= 2 and body[0] == "0":
        base, digits, prefixed = 8, body[1:], True
    if base0 and "_" in digits:
        if not _underscores_ok(digits, prefixed, base == 16):
            raise ParseError(f"bad digit separators: {text[:40]!r}")
        digits = digits.replace("_", "")
    if not digits or any(ch not in _DIGITS[base] for ch in digits.lower()):
        raise ParseError(f"not an integer: {text[:40]!r}")
    if len(digits.lstrip("0")) > 70:  # past 64 bits in any base; int() refuses very long digit strings
        raise ParseError(f"out of range: {text[:40]!r}")
    value = int(digits, base) * (-1 if sign == "-" else 1)
    low, high = (-(1 << 63), (1 << 63) - 1) if signed else (0, (1 << 64) - 1)
    if not low <= value <= high:
        raise ParseError(f"out of range: {text[:40]!r}")
    return value


def read_int_file(ctx: NodeContext, path: Path, signed: bool = False) -> int:
    """procfs's ReadUintFromFile / ReadIntFromFile: the whole file, TrimSpace, base 10."""
    return parse_go_int(go_trim_space(ctx.read(path)), signed=signed)


def sys_read_file(ctx: NodeContext, path: Path) -> str:
    """A sysfs attribute as procfs's SysReadFile sees it: one read of at most 128 bytes (whitespace not trimmed)."""
    text = ctx.read(path)
    raw = text.encode()
    return raw[:128].decode(errors="replace") if len(raw) > 128 else text


def go_glob(directory: Path, pattern: re.Pattern[str]) -> list[Path]:
    """``filepath.Glob(directory/<pattern>)``: matching entries in byte order; an unreadable directory is none."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / n for n in sorted(names, key=os.fsencode) if pattern.fullmatch(n)]


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


def explode_filename(filename: str) -> tuple[str, int, str] | None:
    """``temp1_crit_alarm`` -> ("temp", 1, "crit_alarm"); ``None`` when the name is no sensor file."""
    m = _FILENAME.fullmatch(filename)
    if m is None:
        return None
    num = m.group("id") or "0"
    if len(num) > 19 or int(num) >= 1 << 63:  # strconv.Atoi overflow
        return None
    return m.group("type"), int(num), m.group("property") or ""


def collect_sensor_data(ctx: NodeContext, directory: Path, data: SensorData) -> None:
    for filename in sorted(os.listdir(directory), key=os.fsencode):  # an unreadable directory fails the chip
        parts = explode_filename(filename)
        if parts is None or parts[0] not in SENSOR_TYPES:
            continue
        kind, num, prop = parts
        try:
            raw = ctx.read(directory / filename).encode()[:128]  # one read(2) of at most 128 bytes
        except (OSError, NotPresent):
            continue  # sick hardware (EIO, EAGAIN) or a directory such as power/: only this file is lost
        data.setdefault(f"{kind}{num}", {})[prop] = raw.decode(errors="replace").strip("\n")


def chip_label(ctx: NodeContext, directory: Path) -> str:
    """node_exporter's hwmonName: "<parent dir>_<device dir>" of the resolved device, else name, else hwmonN."""
    try:
        device = os.path.realpath(directory / "device", strict=True)
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
        name = clean_name(ctx.read(directory / "name"))
    except (OSError, NotPresent):
        name = ""
    if name:
        return name
    name = clean_name(os.path.basename(os.path.realpath(directory, strict=True)))
    if not name:
        raise ParseError(f"Could not derive a monitoring name for {directory}")
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
        value = parse_go_float(values.get("", ""))
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
        value = parse_go_float(text)
        if value is None:
            continue
        unit = _unit(kind, element, name)
        if unit is None:
            fams.add(name, f"Hardware monitor {kind} element {element}", "gauge", value, labels)
            continue
        family, help, ftype, factor, divide = unit
        fams.add(family, help, ftype, value / factor if divide else value * factor, labels)


def update_chip(ctx: NodeContext, directory: Path, fams: Families) -> None:
    """One chip; an exception means node_exporter's updateHwmon failed (nothing of this chip is exported)."""
    chip = chip_label(ctx, directory)
    include, exclude = compile_filter(ctx.options.hwmon.chip_include), compile_filter(ctx.options.hwmon.chip_exclude)
    if (exclude is not None and exclude.search(chip)) or (include is not None and not include.search(chip)):
        return  # node_exporter >= 1.7's --collector.hwmon.chip-include/-exclude (1.5.0 has no such flags)
    data: SensorData = {}
    collect_sensor_data(ctx, directory, data)
    if os.path.exists(directory / "device"):
        collect_sensor_data(ctx, directory / "device", data)
    try:
        chip_name = clean_name(ctx.read(directory / "name"))
    except (OSError, NotPresent):
        chip_name = ""
    if chip_name:
        help = "Annotation metric for human-readable chip names"
        fams.add("node_hwmon_chip_names", help, "gauge", 1.0, {"chip": chip, "chip_name": chip_name})
    for sensor, values in data.items():
        emit_sensor(fams, chip, sensor, values)


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
        path = base / entry
        if path.is_symlink():
            try:
                path.stat()
                error = None
            except OSError as exc:
                error = exc
                continue
        if not path.is_dir():
            continue
        try:
            update_chip(ctx, path, fams)
        except Exception as exc:  # node_exporter goes on with the next chip
            error = exc
    out.extend(fams.by_name.values())
    if error is not None:
        raise error
