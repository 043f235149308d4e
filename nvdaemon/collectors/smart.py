"""SMART health of whole disks (tier ``smart``) through pySMART over smartmontools' ``smartctl``.

*Discovery*: the whole disks under devRoot (``sdX``, ``nvmeXnY``; partitions, loop, dm, sr and everything else
skipped), or the explicit ``smart.devices`` list (kernel names; a ``/dev/`` prefix is accepted and resolved under
devRoot). A device is named by its kernel name everywhere.

*Reading*: pySMART runs each device's smartctl invocations through the replaced edge of ``smart_edge`` (every run
with ``--nocheck=standby``, its own process group, the C locale and a hard ``smart.timeoutSeconds`` after which the
group is killed; every run recorded), and ``smart_report`` builds the device's report from pySMART's parse. From
the recorded runs ``read_device`` tells *unreadable* (open refused: permission, capability), *standby*, *timeout*
and *unparseable* apart, which pySMART itself does not report.

Devices are read by at most ``smart.maxConcurrent`` threads inside the one gather thread of the tier (so 24 disks
never run 24 smartctl at once), and the gather's own time limit is derived from that (``read_timeout``).

*Unreadable is not silent*: a device smartctl cannot open is logged once (per device and reason) with the reason
and the fix, reported as ``nodevitals_smart_device_readable{device} 0``, listed in ``/v1/status`` and counted as a
collector error. Output that is garbage or cut short costs only that device (a counted parse error); output over
``smart_edge.STDOUT_LIMIT`` (1 MiB) gets the run killed and the device reported in state ``error`` (a counted,
logged collector error), never read whole.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from nvdaemon.collectors import smart_edge
from nvdaemon.collectors.base import Collector, Gathered, HostRoots, Interpreted, NotPresent, ParseError
from nvdaemon.collectors.smart_report import PRIVILEGE_DENIED, DiskReport, build_report, reason_of, text_of
from nvdaemon.model import Kind, Sample, make_labels
from nvdaemon.supervise import describe

if TYPE_CHECKING:
    from nvdaemon.config import Config

log = logging.getLogger(__name__)

WHOLE_DISK = re.compile(r"sd[a-z]{1,4}|nvme[0-9]+n[0-9]+", re.ASCII)
DEFAULT_TIMEOUT = 30.0
DEFAULT_CONCURRENCY = 4
RUNS_PER_DEVICE = 2  # at most: type detection (first cycle only), then --all
PRIVILEGE_FIX = (
    "run the agent as root with CAP_SYS_RAWIO (SATA/SAS passthrough) and CAP_SYS_ADMIN (NVMe admin commands), "
    "e.g. a privileged container, with the host's /dev mounted at devRoot"
)

State = Literal["ok", "standby", "unreadable", "timeout", "parse_error", "error"]
READABLE: tuple[State, ...] = ("ok", "standby")  # asleep in standby is readable: left alone, not an error


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


# ---- one device -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """How reading one device went this cycle."""

    device: str
    state: State
    report: DiskReport | None = None
    reason: str = ""  # why it is not "ok", for logs and /v1/status
    interface: str | None = None  # smartctl's -d type, once known (cached for later cycles)

    @property
    def readable(self) -> bool:
        return self.state in READABLE


def read_device(device: str, path: Path, interface: str | None, smartctl_path: str, timeout: float) -> Outcome:
    """Read one device through pySMART; never raises (the outcome says what went wrong)."""
    try:
        edge = smart_edge.edge()
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
    if runner.overflow:  # not an absent or sleeping disk: something answers, and not as smartctl does
        return Outcome(device, "error", reason=runner.overflow, interface=interface)
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
    found = text_of(disk.smartctl_interface)
    if not found:
        return Outcome(device, "parse_error", reason="smartctl did not report the device type")
    try:
        report = build_report(device, disk, runner.calls[-1], edge)
    except ParseError as exc:
        return Outcome(device, "parse_error", reason=str(exc), interface=found)
    except Exception as exc:
        return Outcome(device, "parse_error", reason=describe(exc), interface=found)
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
                results[nxt[0]] = Outcome(nxt[1], "error", reason=describe(exc))

    threads = [threading.Thread(target=work, name="smartctl", daemon=True) for _ in range(min(workers, len(items)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


# ---- samples ----------------------------------------------------------------------------------------------------
# (metric, ATA attribute id) for the ATA attribute samples; raw counts, each only when the disk has the attribute.
ATA_SAMPLES: tuple[tuple[str, int], ...] = (
    ("smart_reallocated_sectors", 5),
    ("smart_reported_uncorrectable", 187),
    ("smart_command_timeout", 188),
    ("smart_pending_sectors", 197),
    ("smart_offline_uncorrectable", 198),
)
PREFAIL = 0x1  # ATA attribute flag: pre-failure (as opposed to old-age)


def health_passed(report: DiskReport) -> bool | None:
    """SMART overall health the Go agent's way: NVMe ``critical_warning == 0``; ATA failed when a pre-failure
    attribute with a threshold (0 = none defined) is at or below it, None when no such attribute exists; other
    transports (SCSI, which Go does not read) smartctl's own self-assessment."""
    if report.nvme is not None:
        return report.nvme.critical_warning == 0
    if report.protocol != "ATA":
        return report.health_passed
    judged = [a for a in report.attributes if a.flags & PREFAIL and a.thresh]
    if not judged:
        return None
    return all(a.value > (a.thresh or 0) for a in judged)


def samples_of(report: DiskReport, now: float) -> list[Sample]:
    """The Go agent's smart-tier series (device the kernel name, no labels, every one a gauge, so no ``_total`` is
    added to a name lacking it) plus ``smart_device_info{model,serial,firmware}`` 1, which is ours."""
    out: list[Sample] = []

    def add(metric: str, value: float | int | None) -> None:
        if value is not None:
            out.append(Sample(metric, report.device, float(value), Kind.GAUGE, (), "smart", now))

    def positive(value: float | int | None) -> float | int | None:
        return value if value is not None and value > 0 else None

    add("smart_temperature_celsius", report.temperature)
    add("smart_power_on_hours", report.power_on_hours)
    add("smart_power_cycles", report.power_cycles)
    for metric, attr_id in ATA_SAMPLES:
        attr = report.attribute(attr_id)
        add(metric, attr.raw if attr is not None else None)
    passed = health_passed(report)
    add("smart_health_passed", None if passed is None else int(passed))
    add("smart_error_log_count", report.error_log_count)
    add("smart_capacity_bytes", positive(report.capacity_bytes))
    add("smart_logical_block_size_bytes", positive(report.logical_block_size))
    add("smart_rotation_rate_rpm", positive(report.rotation_rate))  # 0: solid state or unreported
    add("smart_interface_speed_bits_per_second", positive(report.interface_speed_current))
    if report.nvme is not None:
        nv = report.nvme
        add("nvme_percentage_used", nv.percentage_used)
        add("nvme_available_spare", nv.available_spare)
        add("nvme_available_spare_threshold", nv.available_spare_threshold)
        add("nvme_media_errors", nv.media_errors)
        add("nvme_critical_warning", nv.critical_warning)
        # Data units are thousands of 512-byte units (NVMe base specification), exact where pySMART's bytes
        # figure is parsed back from smartctl's rounded "[12.0 TB]".
        add("nvme_bytes_read_total", nv.data_units_read * 512_000)
        add("nvme_bytes_written_total", nv.data_units_written * 512_000)
        add("nvme_error_log_entries", nv.error_log_entries)
    out.append(Sample("smart_device_info", report.device, 1.0, Kind.GAUGE, make_labels(report.labels), "smart", now))
    return out


# ---- the collector ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceStatus:
    """What /v1/status and the self metrics show per device (a value: each cycle makes new ones)."""

    state: State
    reason: str = ""
    parse_errors: int = 0

    @property
    def readable(self) -> bool:
        return self.state in READABLE


@dataclass(frozen=True)
class SmartResult(Interpreted):
    """One smart cycle: the samples, each readable disk's report and every disk's status (all read-only)."""

    reports: Mapping[str, DiskReport]  # device -> this cycle's report, for the devices smartctl could read
    status: Mapping[str, DeviceStatus]  # device -> its state this cycle
    discovered: int  # devices as smartctl_exporter counts them (one per NVMe controller)


class SmartCollector(Collector):
    name = "smart"
    tier = "smart"

    def __init__(self) -> None:
        self.smartctl_path = "smartctl"
        self.devices: list[str] = []  # explicit smart.devices; empty: discover under devRoot
        self.timeout = DEFAULT_TIMEOUT
        self.concurrency = DEFAULT_CONCURRENCY
        self.interfaces: dict[str, str] = {}  # device -> smartctl -d type, detected once
        # Per device, last cycle (updated on the loop in interpret): the collector's own state, for detail() and the
        # parse-error counts; surfaces read the SmartResult in the snapshot instead.
        self.status: dict[str, DeviceStatus] = {}
        self.reports: dict[str, DiskReport] = {}  # last good report per device (this cycle's readable ones)
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
        errors = [f"{o.device}: {o.state.replace('_', ' ')}: {o.reason}" for o in outcomes if not o.readable]
        return Gathered(outcomes, errors=errors)

    def interpret(self, gathered: Gathered, now: float) -> SmartResult:
        outcomes: list[Outcome] = gathered.data
        samples: list[Sample] = []
        status: dict[str, DeviceStatus] = {}
        reports: dict[str, DiskReport] = {}
        for o in outcomes:
            if o.interface:
                self.interfaces[o.device] = o.interface
            prev = self.status.get(o.device)
            parse_errors = (prev.parse_errors if prev else 0) + (o.state == "parse_error")
            if o.report is not None:
                reports[o.device] = o.report
                samples += samples_of(o.report, now)
            status[o.device] = DeviceStatus(o.state, o.reason, parse_errors=parse_errors)
            self._log_readability(o)
        self.status, self.reports = status, reports
        return SmartResult(
            tuple(samples),
            reports=MappingProxyType(dict(reports)),  # copies: the collector's own dicts stay its own
            status=MappingProxyType(dict(status)),
            discovered=self.discovered_labels(),
        )

    def discovered_labels(self) -> int:
        """Devices as smartctl_exporter counts them (one per NVMe controller)."""
        return len({controller_of(name) for name in self.status})

    def _identity(self, name: str) -> dict[str, str]:
        r = self.reports.get(name)
        return {"model": r.model, "serial": r.serial, "interface": r.interface} if r is not None else {}

    def _log_readability(self, o: Outcome) -> None:
        """Once per device and reason: what could not be read, why, and the fix; once more when it recovers."""
        if o.state == "unreadable":
            if self._logged.get(o.device) != o.reason:
                self._logged[o.device] = o.reason
                privileged = PRIVILEGE_DENIED.search(o.reason)
                fix = PRIVILEGE_FIX if privileged else f"check that {o.device} exists under devRoot and is a disk"
                log.warning("SMART: %s is unreadable (%s); fix: %s", o.device, o.reason, fix)
        elif o.readable and o.device in self._logged:
            del self._logged[o.device]
            log.info("SMART: %s is readable again", o.device)

    def detail(self) -> dict[str, Any]:
        """Per device: state (ok, standby, unreadable, timeout, parse_error, error), why, parse errors so far, and
        for a device read this cycle its model, serial and interface."""
        return {
            "devices": {
                name: {
                    "state": st.state,
                    "readable": st.readable,
                    **({"reason": st.reason} if st.reason else {}),
                    "parseErrors": st.parse_errors,
                    **self._identity(name),
                }
                for name, st in sorted(self.status.items())
            },
            "unreadable": sorted(name for name, st in self.status.items() if not st.readable),
        }


def smart_result(snapshots: Mapping[str, Any]) -> SmartResult | None:
    """The smart tier's result in its latest snapshot (tier -> ``TierSnapshot``; typed loosely so collectors need
    not import the tier layer); None if that tier does not run or that cycle produced none."""
    snap = snapshots.get("smart")
    result = snap.results.get("smart") if snap is not None else None
    return result if isinstance(result, SmartResult) else None
