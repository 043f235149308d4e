"""SMART health of whole disks (tier ``smart``) through pySMART over smartmontools' ``smartctl``.

*Discovery*: the whole disks under devRoot (``sdX``, ``nvmeXnY``; partitions, loop, dm, sr and everything else
skipped), or the explicit ``smart.devices`` list (kernel names; a ``/dev/`` prefix is accepted and resolved under
devRoot). A device is named by its kernel name everywhere.

*Reading*: pySMART runs each device's smartctl invocations (type detection once per device, then ``--all``) and
parses them. The narrow edge it calls is replaced (``_Smartctl``) so that every run

- carries ``--nocheck=standby``: a sleeping disk answers "in STANDBY mode" and is left asleep, never spun up;
- runs in its own process group with the C locale and a hard timeout (``smart.timeoutSeconds``), after which the
  whole group is SIGKILLed and reaped: a stuck smartctl is killed, never abandoned;
- is recorded (arguments, exit status, output) so the collector can tell *unreadable* (open refused: permission,
  capability), *standby*, *timeout* and *unparseable* apart, which pySMART itself does not report.

Devices are read by at most ``smart.maxConcurrent`` threads inside the one gather thread of the tier (so 24 disks
never run 24 smartctl at once), and the gather's own time limit is derived from that (``read_timeout``).

*Containment*: pySMART is imported only when the tier runs (it costs ~11 MB), with its process-wide side effects
undone: it sets ``os.environ["LANG"] = "C"`` and installs its logger class for every logger created afterwards.
The C locale is given to the smartctl child processes only.

*Unreadable is not silent*: a device smartctl cannot open is logged once (per device and reason) with the reason
and the fix, reported as ``nodevitals_smart_device_readable{device} 0``, listed in ``/v1/state`` and counted as a
collector error. Output that is garbage or cut short costs only that device (a counted parse error).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from nvdaemon.collectors.base import Collector, Gathered, HostRoots, NotPresent, ParseError
from nvdaemon.model import Kind, Sample, make_labels

if TYPE_CHECKING:
    from nvdaemon.config import Config

log = logging.getLogger(__name__)

WHOLE_DISK = re.compile(r"sd[a-z]{1,4}|nvme[0-9]+n[0-9]+", re.ASCII)
DEFAULT_TIMEOUT = 30.0
DEFAULT_CONCURRENCY = 4
RUNS_PER_DEVICE = 2  # at most: type detection (first cycle only), then --all
NOCHECK = "--nocheck=standby"
PRIVILEGE_FIX = (
    "run the agent as root with CAP_SYS_RAWIO (SATA/SAS passthrough) and CAP_SYS_ADMIN (NVMe admin commands), "
    "e.g. a privileged container, with the host's /dev mounted at devRoot"
)

State = Literal["ok", "standby", "unreadable", "timeout", "parse_error", "error"]


# ---- discovery ------------------------------------------------------------------------------------------------
def _natural(name: str) -> tuple[Any, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"([0-9]+)", name))


def discover(dev: Path) -> list[str]:
    """Kernel names of the whole disks under ``dev`` (sdX, nvmeXnY), in natural order."""
    try:
        names = [p.name for p in dev.iterdir()]
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NotPresent(str(dev)) from exc
    # Kernel order: sda..sdz, sdaa..; then nvme0n1, nvme0n2, nvme1n1, .., nvme10n1.
    disks = sorted(
        (n for n in names if WHOLE_DISK.fullmatch(n)),
        key=lambda n: (n.startswith("nvme"), len(n) if n.startswith("sd") else 0, _natural(n)),
    )
    if not disks:
        raise NotPresent(f"{dev}: no sdX or nvmeXnY devices")
    return disks


def configured_devices(devices: Sequence[str]) -> list[str]:
    """The kernel names of ``smart.devices`` entries (``sda`` or ``/dev/sda``), duplicates dropped."""
    out: list[str] = []
    for entry in devices:
        name = entry.removeprefix("/dev/").strip("/")
        if name and name not in out:
            out.append(name)
    return out


def controller_of(device: str) -> str:
    """``nvme0n1`` -> ``nvme0`` (smartctl_exporter labels NVMe by controller); other names unchanged."""
    m = re.fullmatch(r"(nvme[0-9]+)n[0-9]+", device)
    return m.group(1) if m else device


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


@dataclass(frozen=True)
class Outcome:
    """How reading one device went this cycle."""

    device: str
    state: State
    report: DiskReport | None = None
    reason: str = ""  # why it is not "ok", for logs and /v1/state
    interface: str | None = None  # smartctl's -d type, once known (cached for later cycles)

    @property
    def readable(self) -> bool:
        return self.state in ("ok", "standby")


# ---- pure parsing of what pySMART does not read -----------------------------------------------------------------
_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9 ./-]*?):\s*(.*?)\s*$")
_NUMBER = re.compile(r"[0-9][0-9,]*")


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
        m = re.search(r"(?:open device|failed|error).*?:\s*(Permission denied|Operation not permitted)", line, re.I)
        if m:
            return "unreadable", line.strip()
        if line.startswith("Smartctl open device:"):
            return "unreadable", line.strip()
    return None


# ---- the pySMART edge -------------------------------------------------------------------------------------------
class SmartctlTimeout(Exception):
    pass


@dataclass
class Call:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


_LIVE: set[subprocess.Popen[bytes]] = set()  # smartctl processes running now: killed if the agent exits first
_LIVE_LOCK = threading.Lock()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: a wrapper script's children too
    try:
        proc.communicate(timeout=5)  # reap it and drain the pipes
    except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipes: stop waiting for EOF
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


@atexit.register
def _kill_live() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def run_smartctl(argv: list[str], timeout: float) -> Call:
    """One smartctl run: own process group, C locale for the child only, killed (group) at ``timeout``."""
    env = {**os.environ, "LANG": "C", "LC_ALL": "C"}
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise SmartctlTimeout(f"smartctl killed after {timeout:g}s: {' '.join(argv[1:])}") from None
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    return Call(argv, proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


_IMPORT_LOCK = threading.RLock()


def import_pysmart() -> ModuleType:
    """Import pySMART with its process-wide side effects undone (LANG, the logger class)."""
    with _IMPORT_LOCK:
        module = sys.modules.get("pySMART")
        if module is not None:
            return module
        saved_lang = os.environ.get("LANG")
        saved_logger_class = logging.getLoggerClass()
        try:
            import pySMART  # noqa: F401  (the import is the point: it runs pySMART's module-level side effects)

            return sys.modules["pySMART"]
        finally:
            if saved_lang is None:
                os.environ.pop("LANG", None)
            else:
                os.environ["LANG"] = saved_lang
            logging.setLoggerClass(saved_logger_class)


@dataclass
class _Edge:
    """pySMART's Smartctl and Device, with the edge replaced: built once, after the contained import."""

    smartctl: Callable[..., Any]
    device: Callable[..., Any]
    ata: Any  # pySMART.interface.AtaAttributes
    nvme: Any  # pySMART.interface.NvmeAttributes


_EDGE: _Edge | None = None


def _edge() -> _Edge:
    global _EDGE
    with _IMPORT_LOCK:
        if _EDGE is None:
            _EDGE = _build_edge()
        return _EDGE


def _build_edge() -> _Edge:
    import_pysmart()
    from pySMART.device import Device
    from pySMART.interface import AtaAttributes, NvmeAttributes
    from pySMART.smartctl import Smartctl

    class RecordingSmartctl(Smartctl):  # type: ignore[misc]
        """Every call: --nocheck=standby, a hard timeout with a group kill, recorded."""

        def __init__(self, path: str, timeout: float) -> None:
            super().__init__(smartctl_path=path, options=[NOCHECK])
            self.timeout = timeout
            self.calls: list[Call] = []
            self.timed_out = ""

        def generic_call(self, params: list[str], pass_options: bool = False) -> tuple[list[str], int]:
            return super().generic_call(params, pass_options=True)  # type: ignore[no-any-return]

        def _exec(self, cmd: list[str]) -> tuple[list[str], int]:
            try:
                call = run_smartctl([str(c) for c in cmd], self.timeout)
            except SmartctlTimeout as exc:
                self.timed_out = str(exc)  # pySMART swallows exceptions in places; the collector checks this
                raise
            self.calls.append(call)
            return call.stdout.splitlines(), call.returncode

    class HostDevice(Device):  # type: ignore[misc]
        """A Device whose smartctl argument is the node under devRoot, not pySMART's hard-wired /dev/<name>."""

        def __init__(self, name: str, path: str, interface: str | None, smartctl: Any) -> None:
            self._host_path = path
            super().__init__(name, interface=interface, smartctl=smartctl)

        @property
        def dev_reference(self) -> str:
            return self._host_path

    return _Edge(RecordingSmartctl, HostDevice, AtaAttributes, NvmeAttributes)


# ---- one device -------------------------------------------------------------------------------------------------
def _text(value: Any) -> str:
    return str(value).strip() if value is not None else ""


def _require(missing: list[str], what: str, value: Any) -> None:
    if value is None or value == "":
        missing.append(what)


def build_report(device: str, disk: Any, call: Call, edge: _Edge) -> DiskReport:
    """The report from pySMART's parsed Device plus what it does not read; ParseError when the output lacks a
    section we read from (garbage, or a torn/truncated output)."""
    lines = call.stdout.splitlines()
    fields = info_fields(lines)
    interface = _text(disk.smartctl_interface)
    missing: list[str] = []
    model, serial, firmware = _text(disk.model), _text(disk.serial), _text(disk.firmware)
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
        nv: Any = attrs
        values = {
            "critical warning": nv.criticalWarning,
            "available spare": nv.availableSpare,
            "available spare threshold": nv.availableSpareThreshold,
            "percentage used": nv.percentageUsed,
            "data units read": nv.dataUnitsRead,
            "data units written": nv.dataUnitsWritten,
            "media errors": nv.integrityErrors,
            "error log entries": nv.errorEntries,
            "power on hours": nv.powerOnHours,
            "power cycles": nv.powerCycles,
        }
        for what, v in values.items():
            _require(missing, what, v)
        if missing:
            raise ParseError(f"{device}: smartctl output lacks {', '.join(missing)} (truncated or not smartctl)")
        total = fields.get("Total NVM Capacity")
        return DiskReport(
            **common,
            protocol="NVMe",
            power_on_hours=nv.powerOnHours,
            power_cycles=nv.powerCycles,
            nvme_total_capacity=leading_int(total) if total else None,
            nvme=NvmeHealth(
                critical_warning=nv.criticalWarning,
                available_spare=nv.availableSpare,
                available_spare_threshold=nv.availableSpareThreshold,
                percentage_used=nv.percentageUsed,
                data_units_read=nv.dataUnitsRead,
                data_units_written=nv.dataUnitsWritten,
                media_errors=nv.integrityErrors,
                error_log_entries=nv.errorEntries,
            ),
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
                raw_text=_text(a.raw),
            )
            for a in attrs.legacyAttributes
            if a is not None
        )
        errors = ata_error_count(lines)
        _require(missing, "SMART error log", errors)
        if missing:
            raise ParseError(f"{device}: smartctl output lacks {', '.join(missing)} (truncated or not smartctl)")
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
    if missing:  # SCSI/SAS and others: what pySMART gives, health and temperature
        raise ParseError(f"{device}: smartctl output lacks {', '.join(missing)} (truncated or not smartctl)")
    return DiskReport(**common, protocol="SCSI" if interface == "scsi" else interface.upper())


def read_device(device: str, path: Path, interface: str | None, smartctl_path: str, timeout: float) -> Outcome:
    """Read one device through pySMART; never raises (the outcome says what went wrong)."""
    try:
        edge = _edge()
    except ImportError as exc:
        return Outcome(device, "error", reason=f"pySMART is not installed: {exc}")
    runner = edge.smartctl(smartctl_path, timeout)
    try:
        disk = edge.device(device, str(path), interface, runner)
        failure: Exception | None = None
    except Exception as exc:  # pySMART met output it could not parse, or our timeout
        disk, failure = None, exc
    if runner.timed_out:
        return Outcome(device, "timeout", reason=runner.timed_out, interface=interface)
    for call in runner.calls:
        said = reason_of(call.stdout + "\n" + call.stderr)
        if said is not None and (call.returncode & 2 or said[0] == "unreadable"):
            state: State = "standby" if said[0] == "standby" else "unreadable"
            return Outcome(device, state, reason=said[1], interface=interface)
        if call.returncode & 1 and ("--all" in call.argv or "test" in call.argv):  # not pySMART's follow-ups
            first = next((ln for ln in call.stdout.splitlines()[3:] if ln.strip()), call.stderr.strip())
            return Outcome(device, "error", reason=f"smartctl rejected its command line: {first}")
    if not runner.calls:
        return Outcome(device, "error", reason=f"smartctl did not run: {failure}")
    if failure is not None or disk is None:
        return Outcome(device, "parse_error", reason=f"pySMART could not parse smartctl's output: {failure!r}")
    found = _text(disk.smartctl_interface)
    if not found:
        return Outcome(device, "parse_error", reason="smartctl did not report the device type")
    try:
        report = build_report(device, disk, runner.calls[-1], edge)
    except ParseError as exc:
        return Outcome(device, "parse_error", reason=str(exc), interface=found)
    except Exception as exc:
        return Outcome(device, "parse_error", reason=f"{type(exc).__name__}: {exc}", interface=found)
    return Outcome(device, "ok", report=report, interface=found)


def map_bounded(fn: Callable[[str], Outcome], items: Sequence[str], workers: int) -> list[Outcome]:
    """``fn`` over ``items`` on at most ``workers`` daemon threads (never holding up interpreter exit), in order."""
    results: list[Outcome | None] = [None] * len(items)
    pending = iter(enumerate(items))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                nxt = next(pending, None)
            if nxt is None:
                return
            try:
                results[nxt[0]] = fn(nxt[1])
            except Exception as exc:  # a bug here must cost one device, not the cycle
                results[nxt[0]] = Outcome(nxt[1], "error", reason=f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, name="smartctl", daemon=True) for _ in range(min(workers, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


# ---- samples ----------------------------------------------------------------------------------------------------
# (metric, kind, ATA attribute id) for the ATA attribute samples; raw counts.
ATA_SAMPLES: tuple[tuple[str, Kind, int], ...] = (
    ("smart_reallocated_sectors", Kind.COUNTER, 5),
    ("smart_reported_uncorrectable", Kind.COUNTER, 187),
    ("smart_command_timeout", Kind.COUNTER, 188),
    ("smart_pending_sectors", Kind.GAUGE, 197),  # falls when a pending sector is rewritten or remapped
    ("smart_offline_uncorrectable", Kind.GAUGE, 198),  # falls after a successful offline scan
)


def samples_of(report: DiskReport, now: float) -> list[Sample]:
    labels = make_labels(report.labels)
    out: list[Sample] = []

    def add(metric: str, value: float | int | None, kind: Kind = Kind.GAUGE) -> None:
        if value is not None:
            out.append(Sample(metric, report.device, float(value), kind, labels, "smart", now))

    add("smart_temperature_celsius", report.temperature)
    add("smart_power_on_hours", report.power_on_hours, Kind.COUNTER)
    add("smart_power_cycles", report.power_cycles, Kind.COUNTER)
    for metric, kind, attr_id in ATA_SAMPLES:
        attr = report.attribute(attr_id)
        add(metric, attr.raw if attr is not None else None, kind)
    add("smart_health_passed", None if report.health_passed is None else int(report.health_passed))
    add("smart_error_log_count", report.error_log_count, Kind.COUNTER)
    add("smart_capacity_bytes", report.capacity_bytes)
    if report.nvme is not None:
        nv = report.nvme
        add("nvme_percentage_used", nv.percentage_used)
        add("nvme_available_spare", nv.available_spare)
        add("nvme_available_spare_threshold", nv.available_spare_threshold)
        add("nvme_media_errors", nv.media_errors, Kind.COUNTER)
        add("nvme_critical_warning", nv.critical_warning)
        # Data units are thousands of 512-byte units (NVMe base specification), exact where pySMART's bytes
        # figure is parsed back from smartctl's rounded "[12.0 TB]".
        add("nvme_bytes_read_total", nv.data_units_read * 512_000, Kind.COUNTER)
        add("nvme_bytes_written_total", nv.data_units_written * 512_000, Kind.COUNTER)
        add("nvme_error_log_entries", nv.error_log_entries, Kind.COUNTER)
    return out


# ---- the collector ----------------------------------------------------------------------------------------------
@dataclass
class DeviceStatus:
    """What /v1/state and the self metrics show per device."""

    state: State
    reason: str = ""
    parse_errors: int = 0
    model: str = ""
    serial: str = ""
    interface: str = ""

    @property
    def readable(self) -> bool:
        return self.state in ("ok", "standby")


@dataclass
class SmartData:
    outcomes: list[Outcome] = field(default_factory=list)


class SmartCollector(Collector):
    name = "smart"
    tier = "smart"

    def __init__(self) -> None:
        self.smartctl_path = "smartctl"
        self.devices: list[str] = []  # explicit smart.devices; empty: discover under devRoot
        self.timeout = DEFAULT_TIMEOUT
        self.concurrency = DEFAULT_CONCURRENCY
        self.interfaces: dict[str, str] = {}  # device -> smartctl -d type, detected once
        self.status: dict[str, DeviceStatus] = {}  # per device, last cycle (updated on the loop in interpret)
        self.reports: dict[str, DiskReport] = {}  # last good report per device (this cycle's readable ones)
        self.names: list[str] = []  # devices of the last cycle, readable or not
        self._known = 0  # devices seen by the last gather (sizes the gather's time limit)
        self._logged: dict[str, str] = {}  # device -> the unreadable reason already logged

    def configure(self, config: Config) -> None:
        smart = config.smart
        self.smartctl_path = smart.smartctl_path
        self.devices = configured_devices(smart.devices)
        self.timeout = smart.timeout_seconds
        self.concurrency = smart.max_concurrent
        self._known = len(self.devices)

    def read_timeout(self, default: float) -> float:
        """Every smartctl run is killed at ``timeout``; the gather is abandoned only if that somehow fails."""
        batches = math.ceil(max(self._known, 1) / self.concurrency)
        return default + self.timeout * RUNS_PER_DEVICE * batches

    def gather(self, roots: HostRoots) -> Gathered:
        names = self.devices or discover(roots.dev)
        self._known = len(names)
        known = dict(self.interfaces)

        def one(name: str) -> Outcome:
            hint = known.get(name) or ("nvme" if name.startswith("nvme") else None)
            return read_device(name, roots.dev / name, hint, self.smartctl_path, self.timeout)

        outcomes = map_bounded(one, names, self.concurrency)
        errors = [
            f"{o.device}: {o.state.replace('_', ' ')}: {o.reason}" for o in outcomes if o.state not in ("ok", "standby")
        ]
        return Gathered(SmartData(outcomes), errors=errors)

    def interpret(self, gathered: Gathered, now: float) -> list[Sample]:
        data: SmartData = gathered.data
        samples: list[Sample] = []
        status: dict[str, DeviceStatus] = {}
        reports: dict[str, DiskReport] = {}
        for o in data.outcomes:
            if o.interface:
                self.interfaces[o.device] = o.interface
            prev = self.status.get(o.device)
            st = DeviceStatus(o.state, o.reason, parse_errors=prev.parse_errors if prev else 0)
            if o.state == "parse_error":
                st.parse_errors += 1
            if o.report is not None:
                reports[o.device] = o.report
                st.model, st.serial, st.interface = o.report.model, o.report.serial, o.report.interface
                samples += samples_of(o.report, now)
            status[o.device] = st
            self._log_readability(o)
        self.status, self.reports = status, reports
        self.names = [o.device for o in data.outcomes]
        return samples

    def discovered_labels(self) -> int:
        """Devices as smartctl_exporter counts them (one per NVMe controller)."""
        return len({controller_of(name) for name in self.names})

    def _log_readability(self, o: Outcome) -> None:
        """Once per device and reason: what could not be read, why, and the fix; once more when it recovers."""
        if o.state == "unreadable":
            if self._logged.get(o.device) != o.reason:
                self._logged[o.device] = o.reason
                privileged = re.search(r"Permission denied|Operation not permitted", o.reason)
                fix = PRIVILEGE_FIX if privileged else f"check that {o.device} exists under devRoot and is a disk"
                log.warning("SMART: %s is unreadable (%s); fix: %s", o.device, o.reason, fix)
        elif o.readable and o.device in self._logged:
            del self._logged[o.device]
            log.info("SMART: %s is readable again", o.device)

    def detail(self) -> dict[str, Any]:
        """Per device: state (ok, standby, unreadable, timeout, parse_error, error), why, parse errors so far."""
        return {
            "devices": {
                name: {
                    "state": st.state,
                    "readable": st.readable,
                    **({"reason": st.reason} if st.reason else {}),
                    "parseErrors": st.parse_errors,
                    **({"model": st.model, "serial": st.serial, "interface": st.interface} if st.model else {}),
                }
                for name, st in sorted(self.status.items())
            },
            "unreadable": sorted(name for name, st in self.status.items() if not st.readable),
        }


def smart_collector(snapshots: Mapping[str, Any]) -> SmartCollector | None:
    """The smart tier's collector behind the latest snapshot (``TierSnapshot.sources``), if that tier runs."""
    snap = snapshots.get("smart")
    collector = snap.sources.get("smart") if snap is not None else None
    return collector if isinstance(collector, SmartCollector) else None
