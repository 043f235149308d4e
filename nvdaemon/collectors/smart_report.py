"""What one disk said: the report the smart tier builds from pySMART's parse of ``smartctl --all``, plus the fields
pySMART does not read (parsed here from the same output, no I/O).

``build_report`` refuses (``ParseError``) output that lacks a section it reads from (garbage, or a torn or truncated
run), so a cut output never yields a wrong value: the device is skipped for that cycle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nvdaemon.collectors.base import ParseError

if TYPE_CHECKING:
    from nvdaemon.collectors.smart_edge import Call, Edge


# ---- the report: what one device said --------------------------------------------------------------------------
@dataclass(frozen=True)
class AtaAttribute:
    id: int
    name: str
    flags: int
    value: int
    worst: int
    thresh: int | None
    raw: int | None  # the leading integer of smartctl's printed raw value
    raw_text: str


@dataclass(frozen=True)
class NvmeHealth:
    critical_warning: int
    available_spare: int
    available_spare_threshold: int
    percentage_used: int
    data_units_read: int
    data_units_written: int
    media_errors: int
    error_log_entries: int


@dataclass(frozen=True)
class DiskReport:
    """Everything the samples and the smartctl_exporter surface need about one device, from one smartctl run."""

    device: str
    interface: str  # smartctl's -d type: sat, ata, nvme, scsi
    protocol: str  # ATA, NVMe, SCSI
    model: str
    serial: str
    firmware: str
    family: str = ""
    health_passed: bool | None = None
    temperature: float | None = None
    power_on_hours: int | None = None
    power_on_minutes: int = 0
    power_cycles: int | None = None
    capacity_bytes: int | None = None
    nvme_total_capacity: int | None = None
    logical_block_size: int | None = None
    physical_block_size: int | None = None
    rotation_rate: int | None = None
    ata_version: str = ""
    sata_version: str = ""
    form_factor: str = ""
    additional_product_id: str = ""
    interface_speed_max: float | None = None  # bits per second
    interface_speed_current: float | None = None
    attributes: tuple[AtaAttribute, ...] = ()
    error_log_count: int | None = None  # ATA error log (summary)
    nvme: NvmeHealth | None = None
    exit_status: int = 0

    def attribute(self, attr_id: int) -> AtaAttribute | None:
        return next((a for a in self.attributes if a.id == attr_id), None)

    @property
    def labels(self) -> dict[str, str]:
        return {"model": self.model, "serial": self.serial, "firmware": self.firmware}


# ---- pure parsing of what pySMART does not read -----------------------------------------------------------------
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9 ./-]*?):\s*(.*?)\s*$")
_NUMBER = re.compile(r"[0-9][0-9,]*")
PRIVILEGE_DENIED = re.compile(r"Permission denied|Operation not permitted")  # the open needs privileges


def info_fields(lines: Iterable[str]) -> dict[str, str]:
    """``Key: value`` lines of the information section (first occurrence wins)."""
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith("=== START OF") and "INFORMATION" not in line:
            break
        m = _FIELD.match(line)
        if m and m.group(1) not in fields:
            fields[m.group(1)] = m.group(2)
    return fields


def leading_int(text: str) -> int | None:
    m = _NUMBER.search(text)
    return int(m.group().replace(",", "")) if m else None


def block_sizes(fields: dict[str, str]) -> tuple[int | None, int | None]:
    """``Sector Size: 512 bytes logical/physical`` or ``Sector Sizes: 512 bytes logical, 4096 bytes physical``;
    NVMe: ``Namespace 1 Formatted LBA Size: 512`` (logical only, as smartctl reports it)."""
    text = fields.get("Sector Sizes") or fields.get("Sector Size") or ""
    m = re.match(r"(\d+) bytes logical, (\d+) bytes physical", text)
    if m:
        return int(m.group(1)), int(m.group(2))
    m = re.match(r"(\d+) bytes logical/physical", text)
    if m:
        return int(m.group(1)), int(m.group(1))
    lba = fields.get("Namespace 1 Formatted LBA Size")
    return (leading_int(lba) if lba else None), None


def sata_speeds(text: str) -> tuple[str, float | None, float | None]:
    """``SATA 3.3, 6.0 Gb/s (current: 3.0 Gb/s)`` -> ("SATA 3.3", 6e9, 3e9) in bits per second."""
    version, _, rest = text.partition(",")
    m = re.search(r"([0-9.]+) Gb/s(?: \(current: ([0-9.]+) Gb/s\))?", rest)
    if not m:
        return version.strip(), None, None
    top = float(m.group(1)) * 1e9
    current = float(m.group(2)) * 1e9 if m.group(2) else None
    return version.strip(), top, current


def ata_error_count(lines: Iterable[str]) -> int | None:
    """The SMART error log's count: ``ATA Error Count: N`` or ``No Errors Logged`` (0); None if the section is
    missing (output cut short)."""
    in_log = False
    for line in lines:
        if line.startswith("SMART Error Log"):
            in_log = True
            continue
        if in_log:
            if line.startswith("No Errors Logged"):
                return 0
            m = re.match(r"ATA Error Count:\s*(\d+)", line)
            if m:
                return int(m.group(1))
    return None


def power_on(text: str) -> tuple[int | None, int]:
    """Attribute 9's raw text: ``12345``, ``33456 (93 45 0)`` or ``1234h+05m+12.345s`` -> (hours, minutes)."""
    m = re.match(r"\s*(\d+)h\+(\d+)m", text)
    if m:
        return int(m.group(1)), int(m.group(2))
    return leading_int(text), 0


def reason_of(text: str) -> tuple[str, str] | None:
    """("standby" | "unreadable", message) when smartctl's output says so, else None."""
    for line in text.splitlines():
        if re.search(r"Device is in (STANDBY|SLEEP|IDLE)", line):
            return "standby", line.strip()
        m = re.search(rf"(?:open device|failed|error).*?:\s*({PRIVILEGE_DENIED.pattern})", line, re.I)
        if m:
            return "unreadable", line.strip()
        if line.startswith("Smartctl open device:"):
            return "unreadable", line.strip()
    return None


# ---- the report from pySMART's Device --------------------------------------------------------------------------
# NvmeHealth field -> pySMART's NvmeAttributes attribute.
NVME_FIELDS: tuple[tuple[str, str], ...] = (
    ("critical_warning", "criticalWarning"),
    ("available_spare", "availableSpare"),
    ("available_spare_threshold", "availableSpareThreshold"),
    ("percentage_used", "percentageUsed"),
    ("data_units_read", "dataUnitsRead"),
    ("data_units_written", "dataUnitsWritten"),
    ("media_errors", "integrityErrors"),
    ("error_log_entries", "errorEntries"),
)


def text_of(value: Any) -> str:
    """A pySMART field as text ("" for None)."""
    return str(value).strip() if value is not None else ""


def _require(missing: list[str], what: str, value: Any) -> None:
    if value is None or value == "":
        missing.append(what)


def _refuse_if_missing(device: str, missing: list[str]) -> None:
    if missing:
        raise ParseError(f"{device}: smartctl output lacks {', '.join(missing)} (truncated or not smartctl)")


def build_report(device: str, disk: Any, call: Call, edge: Edge) -> DiskReport:
    """The report from pySMART's parsed Device plus what it does not read; ParseError when the output lacks a
    section we read from (garbage, or a torn/truncated output)."""
    lines = call.stdout.splitlines()
    fields = info_fields(lines)
    interface = text_of(disk.smartctl_interface)
    missing: list[str] = []
    model, serial, firmware = text_of(disk.model), text_of(disk.serial), text_of(disk.firmware)
    _require(missing, "model", model or None)
    _require(missing, "serial number", serial or None)
    _require(missing, "health self-assessment", disk.assessment)
    logical, physical = block_sizes(fields)
    common: dict[str, Any] = {
        "device": device,
        "interface": interface,
        "model": model,
        "serial": serial,
        "firmware": firmware,
        "health_passed": None if disk.assessment is None else disk.assessment != "FAIL",
        "temperature": float(disk.temperature) if disk.temperature is not None else None,
        "capacity_bytes": disk._capacity,
        "logical_block_size": logical,
        "physical_block_size": physical,
        "exit_status": call.returncode,
    }
    attrs = disk.if_attributes
    if isinstance(attrs, edge.nvme):
        health = {name: getattr(attrs, attr) for name, attr in NVME_FIELDS}
        for name, v in health.items():
            _require(missing, name.replace("_", " "), v)
        _require(missing, "power on hours", attrs.powerOnHours)
        _require(missing, "power cycles", attrs.powerCycles)
        _refuse_if_missing(device, missing)
        total = fields.get("Total NVM Capacity")
        return DiskReport(
            **common,
            protocol="NVMe",
            power_on_hours=attrs.powerOnHours,
            power_cycles=attrs.powerCycles,
            nvme_total_capacity=leading_int(total) if total else None,
            nvme=NvmeHealth(**health),
        )
    if isinstance(attrs, edge.ata):
        table = tuple(
            AtaAttribute(
                id=a.num,
                name=a.name,
                flags=a.flags,
                value=a.value_int,
                worst=a.worst,
                thresh=a.thresh,
                raw=a.raw_int,
                raw_text=text_of(a.raw),
            )
            for a in attrs.legacyAttributes
            if a is not None
        )
        errors = ata_error_count(lines)
        _require(missing, "SMART error log", errors)
        _refuse_if_missing(device, missing)
        by_id = {a.id: a for a in table}
        hours, minutes = power_on(by_id[9].raw_text) if 9 in by_id else (None, 0)
        sata, top, current = sata_speeds(fields.get("SATA Version is", ""))
        return DiskReport(
            **common,
            protocol="ATA",
            family=fields.get("Model Family", ""),
            power_on_hours=hours,
            power_on_minutes=minutes,
            power_cycles=by_id[12].raw if 12 in by_id else None,
            rotation_rate=disk.rotation_rate,
            ata_version=fields.get("ATA Version is", ""),
            sata_version=sata,
            form_factor=fields.get("Form Factor", ""),
            additional_product_id=fields.get("Add. Product Id", ""),
            interface_speed_max=top,
            interface_speed_current=current,
            attributes=table,
            error_log_count=errors,
        )
    if interface in ("sat", "ata", "nvme"):
        raise ParseError(f"{device}: no SMART attribute table in smartctl's output (truncated or not smartctl)")
    _refuse_if_missing(device, missing)  # SCSI/SAS and others: what pySMART gives, health and temperature
    return DiskReport(**common, protocol="SCSI" if interface == "scsi" else interface.upper())
