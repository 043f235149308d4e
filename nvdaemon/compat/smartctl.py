"""smartctl_exporter's metric surface (``smartctlCompat.enabled``), so its dashboards and alerts keep working.

The families, types, label names and HELP texts are those of prometheus-community/smartctl_exporter (``metrics.go``
and ``smartctl.go``): families sorted by name, label pairs by label name, floats as Go's ``strconv`` writes them,
all as client_golang renders them. Devices are labelled as that exporter labels them: the kernel name for SATA/SAS
disks (``sda``) and the NVMe *controller* (``nvme0`` for ``nvme0n1``; a second namespace of the same controller is
not repeated). Values come from the smart tier's latest snapshot: its ``SmartResult``, pySMART's parse of
``smartctl --all``.

Rendered as text by the node_exporter surface's renderer (``family.render``, client_golang's text format) rather
than through prometheus_client, which would rename its counters to ``*_total``. Because the names, types and HELP
texts are smartctl_exporter's, ``promtool check metrics`` says about them exactly what it says about
smartctl_exporter itself (counters without ``_total``, ``_count`` suffixes on a gauge and a counter, no HELP on
``smartctl_device_bytes_read``/``_written``); a drop-in must keep all of that.

Known differences, from reading smartctl's text output where smartctl_exporter reads its JSON:
``attribute_value_type="raw"`` is the leading integer of the printed raw value (identical for plain counters such as
5, 197 and 198; for vendor-packed raws such as ``41 (Min/Max 22/52)`` smartctl_exporter shows the packed 48-bit
number), ``temperature_type`` is only ``current``, and the families that need ``--xall`` (device statistics, SCT,
ERC, self-test log counts) or the JSON header (``smartctl_version``) are not produced.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from nvdaemon.collectors.smart import SmartCollector, SmartResult, controller_of
from nvdaemon.collectors.smart_report import DiskReport
from nvdaemon.compat.node_exporter.family import Family, FamilyType, render

if TYPE_CHECKING:
    from nvdaemon.model import TierSnapshot

Pairs = list[tuple[str, str]]

# name -> (type, HELP), exactly as smartctl_exporter declares them.
FAMILIES: dict[str, tuple[FamilyType, str]] = {
    "smartctl_devices": ("gauge", "Number of devices configured or dynamically discovered"),
    "smartctl_device": ("gauge", "Device info"),
    "smartctl_device_smartctl_exit_status": ("gauge", "Exit status of smartctl on device"),
    "smartctl_device_capacity_blocks": ("gauge", "Device capacity in blocks"),
    "smartctl_device_capacity_bytes": ("gauge", "Device capacity in bytes"),
    "smartctl_device_nvme_capacity_bytes": ("gauge", "NVMe device total capacity bytes"),
    "smartctl_device_block_size": ("gauge", "Device block size"),
    "smartctl_device_interface_speed": ("gauge", "Device interface speed, bits per second"),
    "smartctl_device_attribute": ("gauge", "Device attributes"),
    "smartctl_device_power_on_seconds": ("counter", "Device power on seconds"),
    "smartctl_device_rotation_rate": ("gauge", "Device rotation rate"),
    "smartctl_device_temperature": ("gauge", "Device temperature celsius"),
    "smartctl_device_power_cycle_count": ("counter", "Device power cycle count"),
    "smartctl_device_percentage_used": ("counter", "Device write percentage used"),
    "smartctl_device_available_spare": (
        "counter",
        "Normalized percentage (0 to 100%) of the remaining spare capacity available",
    ),
    "smartctl_device_available_spare_threshold": (
        "counter",
        "When the Available Spare falls below the threshold indicated in this field, an asynchronous event "
        "completion may occur. The value is indicated as a normalized percentage (0 to 100%)",
    ),
    "smartctl_device_critical_warning": (
        "counter",
        "This field indicates critical warnings for the state of the controller",
    ),
    "smartctl_device_media_errors": (
        "counter",
        "Contains the number of occurrences where the controller detected an unrecovered data integrity error. "
        "Errors such as uncorrectable ECC, CRC checksum failure, or LBA tag mismatch are included in this field",
    ),
    "smartctl_device_num_err_log_entries": (
        "counter",
        "Contains the number of Error Information log entries over the life of the controller",
    ),
    "smartctl_device_bytes_read": ("counter", ""),
    "smartctl_device_bytes_written": ("counter", ""),
    "smartctl_device_smart_status": ("gauge", "General smart status"),
    "smartctl_device_error_log_count": ("gauge", "Device SMART error log count"),
}

# ATA attribute flag bits -> (short letter, long name), in smartctl's order (flags.string "POSRCK").
FLAGS: tuple[tuple[int, str, str], ...] = (
    (0x01, "P", "prefailure"),
    (0x02, "O", "updated_online"),
    (0x04, "S", "performance"),
    (0x08, "R", "error_rate"),
    (0x10, "C", "event_count"),
    (0x20, "K", "auto_keep"),
)


def flags_short(flags: int) -> str:
    return "".join(letter if flags & bit else "-" for bit, letter, _ in FLAGS)


def flags_long(flags: int) -> str:
    return ",".join(name for bit, _, name in FLAGS if flags & bit)


def device_samples(label: str, r: DiskReport) -> Iterable[tuple[str, Pairs, float]]:
    """(family, label pairs, value) of one device, as smartctl_exporter's ``SMARTctl.Collect`` mines them."""
    dev = [("device", label)]
    yield "smartctl_device_smartctl_exit_status", dev, r.exit_status
    yield (
        "smartctl_device",
        [
            *dev,
            ("interface", r.interface),
            ("protocol", r.protocol),
            ("model_family", r.family or "unknown"),
            ("model_name", r.model or "unknown"),
            ("serial_number", r.serial),
            ("ata_additional_product_id", r.additional_product_id or "unknown"),
            ("firmware_version", r.firmware),
            ("ata_version", r.ata_version),
            ("sata_version", r.sata_version),
            ("form_factor", r.form_factor),
            ("scsi_vendor", ""),
            ("scsi_product", ""),
            ("scsi_revision", ""),
            ("scsi_version", ""),
        ],
        1,
    )
    capacity = r.capacity_bytes or 0
    blocks = capacity // r.logical_block_size if capacity and r.logical_block_size else 0
    yield "smartctl_device_capacity_blocks", dev, blocks
    yield "smartctl_device_capacity_bytes", dev, capacity
    if r.nvme_total_capacity is not None:
        yield "smartctl_device_nvme_capacity_bytes", dev, r.nvme_total_capacity
    yield "smartctl_device_block_size", [*dev, ("blocks_type", "logical")], r.logical_block_size or 0
    yield "smartctl_device_block_size", [*dev, ("blocks_type", "physical")], r.physical_block_size or 0
    for speed_type, speed in (("max", r.interface_speed_max), ("current", r.interface_speed_current)):
        if speed is not None:
            yield "smartctl_device_interface_speed", [*dev, ("speed_type", speed_type)], speed
    for a in r.attributes:
        base = [
            *dev,
            ("attribute_name", a.name),
            ("attribute_flags_short", flags_short(a.flags)),
            ("attribute_flags_long", flags_long(a.flags)),
        ]
        for value_type, value in (("value", a.value), ("worst", a.worst), ("thresh", a.thresh), ("raw", a.raw)):
            yield (
                "smartctl_device_attribute",
                [
                    *base,
                    ("attribute_value_type", value_type),
                    ("attribute_id", str(a.id)),
                ],
                value or 0,
            )
    if r.power_on_hours is not None:
        yield "smartctl_device_power_on_seconds", dev, r.power_on_hours * 3600 + r.power_on_minutes * 60
    if r.rotation_rate:
        yield "smartctl_device_rotation_rate", dev, r.rotation_rate
    if r.temperature is not None:
        yield "smartctl_device_temperature", [*dev, ("temperature_type", "current")], r.temperature
    if r.power_cycles is not None:
        yield "smartctl_device_power_cycle_count", dev, r.power_cycles
    if r.error_log_count is not None:
        yield "smartctl_device_error_log_count", [*dev, ("error_log_type", "summary")], r.error_log_count
    if r.health_passed is not None:
        yield "smartctl_device_smart_status", dev, 1 if r.health_passed else 0
    if r.nvme is not None and r.interface == "nvme":
        nv = r.nvme
        yield "smartctl_device_percentage_used", dev, nv.percentage_used
        yield "smartctl_device_available_spare", dev, nv.available_spare
        yield "smartctl_device_available_spare_threshold", dev, nv.available_spare_threshold
        yield "smartctl_device_critical_warning", dev, nv.critical_warning
        yield "smartctl_device_media_errors", dev, nv.media_errors
        yield "smartctl_device_num_err_log_entries", dev, nv.error_log_entries
        if nv.data_units_read:  # 0: not reported by the hardware
            yield "smartctl_device_bytes_read", dev, nv.data_units_read * 1000.0 * 512.0
        if nv.data_units_written:
            yield "smartctl_device_bytes_written", dev, nv.data_units_written * 1000.0 * 512.0


def render_reports(reports: Iterable[DiskReport], discovered: int) -> bytes:
    """The exposition text for these device reports (pure: no agent, no I/O)."""
    families = {name: Family(name, help_text, kind) for name, (kind, help_text) in FAMILIES.items()}
    families["smartctl_devices"].add(discovered)
    seen: set[str] = set()
    for r in reports:
        label = controller_of(r.device)
        if label in seen:  # another namespace of an NVMe controller already reported
            continue
        seen.add(label)
        for family, pairs, value in device_samples(label, r):
            families[family].add(value, dict(pairs))
    return render(families)


def render_smartctl(smart: TierSnapshot | None, *, enabled: bool) -> bytes:
    """The smartctl_exporter exposition of the smart tier's snapshot ``smart``; empty unless ``enabled``
    (``smartctlCompat.enabled``). No smart result in it (the tier does not run, or its cycle timed out): no devices.
    """
    if not enabled:
        return b""
    result = smart.results.get(SmartCollector.name) if smart is not None else None
    if not isinstance(result, SmartResult):
        return render_reports([], 0)
    return render_reports(list(result.reports.values()), result.discovered)
