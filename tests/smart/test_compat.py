"""smartctlCompat: smartctl_exporter's families, types, label names and HELP, with the recorded values."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from nvdaemon.collectors.smart import SmartCollector
from nvdaemon.collectors.smart_report import DiskReport
from nvdaemon.compat.node_exporter.family import go_float
from nvdaemon.compat.smartctl import FAMILIES, flags_long, flags_short, render_reports
from tests.smart.conftest import Standin, collector, cycle

# smartctl_exporter's metrics.go (name -> type, HELP, label names); the facts the drop-in must reproduce.
UPSTREAM: dict[str, tuple[str, str, list[str]]] = {
    "smartctl_devices": ("gauge", "Number of devices configured or dynamically discovered", []),
    "smartctl_device": (
        "gauge",
        "Device info",
        [
            "device",
            "interface",
            "protocol",
            "model_family",
            "model_name",
            "serial_number",
            "ata_additional_product_id",
            "firmware_version",
            "ata_version",
            "sata_version",
            "form_factor",
            "scsi_vendor",
            "scsi_product",
            "scsi_revision",
            "scsi_version",
        ],
    ),
    "smartctl_device_smartctl_exit_status": ("gauge", "Exit status of smartctl on device", ["device"]),
    "smartctl_device_capacity_blocks": ("gauge", "Device capacity in blocks", ["device"]),
    "smartctl_device_capacity_bytes": ("gauge", "Device capacity in bytes", ["device"]),
    "smartctl_device_nvme_capacity_bytes": ("gauge", "NVMe device total capacity bytes", ["device"]),
    "smartctl_device_block_size": ("gauge", "Device block size", ["device", "blocks_type"]),
    "smartctl_device_interface_speed": ("gauge", "Device interface speed, bits per second", ["device", "speed_type"]),
    "smartctl_device_attribute": (
        "gauge",
        "Device attributes",
        [
            "device",
            "attribute_name",
            "attribute_flags_short",
            "attribute_flags_long",
            "attribute_value_type",
            "attribute_id",
        ],
    ),
    "smartctl_device_power_on_seconds": ("counter", "Device power on seconds", ["device"]),
    "smartctl_device_rotation_rate": ("gauge", "Device rotation rate", ["device"]),
    "smartctl_device_temperature": ("gauge", "Device temperature celsius", ["device", "temperature_type"]),
    "smartctl_device_power_cycle_count": ("counter", "Device power cycle count", ["device"]),
    "smartctl_device_percentage_used": ("counter", "Device write percentage used", ["device"]),
    "smartctl_device_available_spare": (
        "counter",
        "Normalized percentage (0 to 100%) of the remaining spare capacity available",
        ["device"],
    ),
    "smartctl_device_available_spare_threshold": (
        "counter",
        "When the Available Spare falls below the threshold indicated in this field, an asynchronous event "
        "completion may occur. The value is indicated as a normalized percentage (0 to 100%)",
        ["device"],
    ),
    "smartctl_device_critical_warning": (
        "counter",
        "This field indicates critical warnings for the state of the controller",
        ["device"],
    ),
    "smartctl_device_media_errors": (
        "counter",
        "Contains the number of occurrences where the controller detected an unrecovered data integrity error. "
        "Errors such as uncorrectable ECC, CRC checksum failure, or LBA tag mismatch are included in this field",
        ["device"],
    ),
    "smartctl_device_num_err_log_entries": (
        "counter",
        "Contains the number of Error Information log entries over the life of the controller",
        ["device"],
    ),
    "smartctl_device_bytes_read": ("counter", "", ["device"]),
    "smartctl_device_bytes_written": ("counter", "", ["device"]),
    "smartctl_device_smart_status": ("gauge", "General smart status", ["device"]),
    "smartctl_device_error_log_count": ("gauge", "Device SMART error log count", ["device", "error_log_type"]),
}
# What promtool says about smartctl_exporter's own names (and so about a faithful drop-in): nothing else is allowed.
UPSTREAM_LINT = re.compile(
    r"^smartctl_device_\w+ (counter metrics should have \"_total\" suffix"
    r"|non-histogram and non-summary metrics should not have \"_count\" suffix|no help text)$"
)
SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")


def parse(text: str) -> tuple[dict[str, tuple[str, str]], dict[tuple[str, tuple[tuple[str, str], ...]], str]]:
    meta: dict[str, list[str]] = {}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            meta.setdefault(name, ["", ""])[1] = help_text
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            meta.setdefault(name, ["", ""])[0] = kind
        else:
            m = SAMPLE.match(line)
            assert m, line
            labels = tuple(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            assert [k for k, _ in labels] == sorted(k for k, _ in labels), line  # client_golang sorts label names
            samples[(m.group(1), labels)] = m.group(3)
    return {k: (v[0], v[1]) for k, v in meta.items()}, samples


def fixture_reports(standin: Standin) -> tuple[SmartCollector, list[DiskReport]]:
    c = collector()
    cycle(c)
    return c, list(c.reports.values())


def test_families_are_smartctl_exporters(standin: Standin) -> None:
    c, reports = fixture_reports(standin)
    meta, samples = parse(render_reports(reports, c.discovered_labels()).decode())
    assert set(meta) == set(UPSTREAM) == set(FAMILIES)
    for name, (kind, help_text, labels) in UPSTREAM.items():
        assert meta[name] == (kind, help_text), name
        for fam, pairs in samples:
            if fam == name:
                assert sorted(k for k, _ in pairs) == sorted(labels), name
    assert list(meta) == sorted(meta)  # families in name order, as client_golang gathers them


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], str], name: str, **labels: str) -> str:
    return samples[(name, tuple(sorted(labels.items())))]


def test_values_are_the_recorded_ones(standin: Standin) -> None:
    c, reports = fixture_reports(standin)
    _, s = parse(render_reports(reports, c.discovered_labels()).decode())
    assert value(s, "smartctl_devices") == "4"
    # Devices: kernel names for SATA, the controller for NVMe.
    assert {dict(pairs)["device"] for name, pairs in s if name == "smartctl_device"} == {"sda", "sdb", "nvme0", "nvme1"}
    info = dict(next(pairs for name, pairs in s if name == "smartctl_device" and dict(pairs)["device"] == "sdb"))
    assert info == {
        "device": "sdb",
        "interface": "sat",
        "protocol": "ATA",
        "model_family": "Seagate BarraCuda 3.5",
        "model_name": "ST4000DM004-2CV104",
        "serial_number": "ZFN0ABCD",
        "ata_additional_product_id": "unknown",
        "firmware_version": "0001",
        "ata_version": "ACS-3 T13/2161-D revision 5",
        "sata_version": "SATA 3.1",
        "form_factor": "3.5 inches",
        "scsi_vendor": "",
        "scsi_product": "",
        "scsi_revision": "",
        "scsi_version": "",
    }
    nv = dict(next(pairs for name, pairs in s if name == "smartctl_device" and dict(pairs)["device"] == "nvme1"))
    assert (nv["interface"], nv["protocol"], nv["model_family"], nv["sata_version"]) == ("nvme", "NVMe", "unknown", "")
    expected = {
        ("smartctl_device_capacity_bytes", "sda"): "1.000204886016e+12",
        ("smartctl_device_capacity_blocks", "sda"): "1.953525168e+09",
        ("smartctl_device_capacity_blocks", "sdb"): "7.814037168e+09",
        ("smartctl_device_capacity_blocks", "nvme1"): "4.88378646e+08",  # 4096-byte LBAs
        ("smartctl_device_nvme_capacity_bytes", "nvme0"): "2.000398934016e+12",
        ("smartctl_device_power_on_seconds", "sda"): "4.4442e+07",
        ("smartctl_device_power_on_seconds", "nvme1"): "1.484424e+08",
        ("smartctl_device_rotation_rate", "sdb"): "5425",
        ("smartctl_device_power_cycle_count", "sdb"): "1201",
        ("smartctl_device_smart_status", "sdb"): "1",
        ("smartctl_device_smart_status", "nvme1"): "0",
        ("smartctl_device_smartctl_exit_status", "sdb"): "192",
        ("smartctl_device_smartctl_exit_status", "nvme1"): "8",
        ("smartctl_device_percentage_used", "nvme1"): "97",
        ("smartctl_device_available_spare", "nvme1"): "6",
        ("smartctl_device_available_spare_threshold", "nvme1"): "10",
        ("smartctl_device_critical_warning", "nvme1"): "5",
        ("smartctl_device_media_errors", "nvme1"): "14",
        ("smartctl_device_num_err_log_entries", "nvme1"): "2311",
        ("smartctl_device_bytes_read", "nvme0"): "1.2009875968e+13",
        ("smartctl_device_bytes_written", "nvme1"): "1.200987597312e+15",
    }
    for (name, device), want in expected.items():
        assert value(s, name, device=device) == want, (name, device)
    assert value(s, "smartctl_device_temperature", device="sdb", temperature_type="current") == "41"
    assert value(s, "smartctl_device_error_log_count", device="sdb", error_log_type="summary") == "37"
    assert value(s, "smartctl_device_error_log_count", device="sda", error_log_type="summary") == "0"
    assert value(s, "smartctl_device_block_size", device="sdb", blocks_type="physical") == "4096"
    assert value(s, "smartctl_device_block_size", device="nvme0", blocks_type="physical") == "0"
    assert value(s, "smartctl_device_interface_speed", device="sdb", speed_type="current") == "3e+09"
    assert value(s, "smartctl_device_interface_speed", device="sdb", speed_type="max") == "6e+09"
    assert ("smartctl_device_rotation_rate", (("device", "sda"),)) not in s  # an SSD: 0 is not exported
    attr = {"device": "sdb", "attribute_name": "Current_Pending_Sector", "attribute_id": "197"}
    flags = {"attribute_flags_short": "-O--C-", "attribute_flags_long": "updated_online,event_count"}
    for kind, want in (("value", "100"), ("worst", "100"), ("thresh", "0"), ("raw", "24")):
        assert value(s, "smartctl_device_attribute", **attr, **flags, attribute_value_type=kind) == want
    realloc = {"device": "sdb", "attribute_name": "Reallocated_Sector_Ct", "attribute_id": "5"}
    flags = {
        "attribute_flags_short": "PO--CK",
        "attribute_flags_long": "prefailure,updated_online,event_count,auto_keep",
    }
    assert value(s, "smartctl_device_attribute", **realloc, **flags, attribute_value_type="raw") == "1064"


def test_go_float_and_flags() -> None:
    cases = {34.0: "34", 0.0: "0", 6e9: "6e+09", 123456.0: "123456", 1234567.0: "1.234567e+06", 0.5: "0.5"}
    for v, want in cases.items():
        assert go_float(v) == want
    assert go_float(0.00001) == "1e-05" and go_float(-3.0) == "-3" and go_float(float("nan")) == "NaN"
    assert (flags_short(0x000B), flags_long(0x000B)) == ("PO-R--", "prefailure,updated_online,error_rate")


def test_promtool_finds_only_what_it_finds_in_smartctl_exporter(standin: Standin) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; make test installs it as root)")
    c, reports = fixture_reports(standin)
    text = render_reports(reports, c.discovered_labels())
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30, check=False)
    findings = (out.stdout + out.stderr).decode().splitlines()
    assert findings, "promtool found nothing: were the upstream names changed?"
    assert [f for f in findings if not UPSTREAM_LINT.match(f)] == []
