"""The sensor group of node_exporter collectors: hwmon, thermal_zone, rapl, edac, powersupplyclass.

Three kinds of test: table tests of the Go-semantics parsers; small host roots in ``tmp_path`` with edge cases
(malformed, missing, exotic files) run through both the real node_exporter and ours; and faults a fixture cannot
hold (EIO, ENODATA, EACCES as root) injected through the context's reader, checked against node_exporter's
documented handling.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nvdaemon.collectors.base import HostPath, HostRoots
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, merge, render
from nvdaemon.compat.node_exporter.hwmon import clean_name, explode_filename
from nvdaemon.compat.node_exporter.powersupplyclass import collect_supplies
from nvdaemon.compat.node_exporter.rapl import collect_zones, index_and_name, sanitize_metric_name
from nvdaemon.config import NodeExporterConfig
from tests.node_exporter.conftest import HOSTS
from tests.node_exporter.exposition import parse
from tests.node_exporter.oracle import (
    collect_once,
    compare,
    flags_for,
    node_exporter,
    options_for,
    ours,
    scrape,
    theirs,
)

GROUP = ("hwmon", "thermal_zone", "rapl", "edac", "powersupplyclass")


# ---- parsers -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "want"),
    [("coretemp\n", "coretemp"), ("AC", "ac"), ("it87.2608", "it87_2608"), ("ACPI000D:00", "acpi000d:00"), ("-", "")],
)
def test_clean_name(name: str, want: str) -> None:
    assert clean_name(name) == want


@pytest.mark.parametrize(
    ("filename", "want"),
    [
        ("temp1_input", ("temp", 1, "input")),
        ("temp1_crit_alarm", ("temp", 1, "crit_alarm")),
        ("temp12", ("temp", 12, "")),
        ("beep_enable", ("beep_enable", 0, "")),
        ("power1_average_interval", ("power", 1, "average_interval")),
        ("in_input", ("in_input", 0, "")),  # the type takes every non-digit
        ("temp99999999999999999999_input", None),  # Atoi overflow
    ],
)
def test_explode_filename(filename: str, want: tuple[str, int, str] | None) -> None:
    assert explode_filename(filename) == want


@pytest.mark.parametrize(
    ("name", "want"), [("package", "package"), ("dram", "dram"), ("core-uncore", "core_uncore"), ("a_ - _b", "a_b")]
)
def test_sanitize_metric_name(name: str, want: str) -> None:
    assert sanitize_metric_name(name) == want


def test_index_and_name() -> None:
    seen: dict[str, int] = {}
    assert index_and_name(seen, "package-1") == (1, "package")
    assert index_and_name(seen, "package-x") == (0, "package-x")
    assert index_and_name(seen, "a-b-1") == (0, "a-b-1")
    seen["dram"] = 1
    assert index_and_name(seen, "dram") == (1, "dram")


# ---- host roots against the real node_exporter ---------------------------------------------------------------


def make_host(root: Path, files: dict[str, str], links: dict[str, str] | None = None) -> Path:
    for d in ("proc", "sys"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if text.endswith("/"):
            path.mkdir(exist_ok=True)
        else:
            path.write_text(text)
    for rel, target in (links or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, path)
    return root


def success(text: str, collector: str) -> float:
    fam = parse(text)["node_scrape_collector_success"]
    return fam.samples[(("collector", collector),)]


def against_oracle(root: Path, collector: str) -> tuple[str, str]:
    """Both expositions of one collector on ``root``; asserts they are identical and returns them."""
    options = options_for(root)
    their_text, our_text = theirs(root, options, [collector]), ours(root, options, [collector])
    diffs = compare(their_text, our_text)
    assert not diffs, "\n".join(diffs)
    return their_text, our_text


HWMON_EXOTIC = {
    # an old-style chip: a legacy driver with an upper-case name, no device link, values of every unit kind
    "sys/class/hwmon/hwmon0/name": "W83627EHF Chip\n",
    "sys/class/hwmon/hwmon0/vrm": "10.0\n",
    "sys/class/hwmon/hwmon0/cpu0_vid": "1100\n",
    "sys/class/hwmon/hwmon0/beep_enable": "1\n",
    "sys/class/hwmon/hwmon0/update_interval": "500\n",
    "sys/class/hwmon/hwmon0/humidity1_input": "45300000\n",
    "sys/class/hwmon/hwmon0/energy1_input": "123456789\n",
    "sys/class/hwmon/hwmon0/curr1_input": "1875\n",
    "sys/class/hwmon/hwmon0/curr1_max": "10000\n",
    "sys/class/hwmon/hwmon0/power1_input": "22675000\n",
    "sys/class/hwmon/hwmon0/power1_accuracy": "950000\n",
    "sys/class/hwmon/hwmon0/fan1_input": "1054\n",
    "sys/class/hwmon/hwmon0/fan1_target": "1100\n",
    "sys/class/hwmon/hwmon0/fan1_fault": "0\n",
    "sys/class/hwmon/hwmon0/fan1_pulses": "2\n",
    "sys/class/hwmon/hwmon0/temp1": "41000\n",  # a bare value next to temp1_input: the latter is *_input
    "sys/class/hwmon/hwmon0/temp1_input": "42000\n",
    "sys/class/hwmon/hwmon0/temp1_label": "CPU  \n",  # only newlines are trimmed from labels
    "sys/class/hwmon/hwmon0/temp2_input": "N/A\n",
    "sys/class/hwmon/hwmon0/temp3_input": " 30000\n",
    "sys/class/hwmon/hwmon0/temp4_input": "1_000\n",
    "sys/class/hwmon/hwmon0/temp9_input": "1__000\n",
    "sys/class/hwmon/hwmon0/temp5_input": "0x1p4\n",
    "sys/class/hwmon/hwmon0/temp6_input": "1e400\n",
    "sys/class/hwmon/hwmon0/temp7_MAX": "90000\n",  # the property is lower-cased into the name
    "sys/class/hwmon/hwmon0/in0_input": "",
    "sys/class/hwmon/hwmon0/intrusion0_alarm": "1\n",
    "sys/class/hwmon/hwmon0/pwm1": "128\n",
    "sys/class/hwmon/hwmon0/unknown1_input": "5\n",
    "sys/class/hwmon/hwmon0/temp8_input/": "/",  # a directory where a value belongs: skipped
    # no name and no device: the chip is called after its directory
    "sys/class/hwmon/hwmon1/temp1_input": "50000\n",
    # the sensors of an old coretemp live in its device directory
    "sys/devices/platform/coretemp.0/temp1_input": "44000\n",
    "sys/devices/platform/coretemp.0/temp1_label": "Physical id 0\n",
    "sys/devices/platform/coretemp.0/name": "coretemp\n",
    "sys/devices/platform/coretemp.0/hwmon/hwmon2/uevent": "",
    # not chips: a plain file in class/hwmon
    "sys/class/hwmon/README": "x\n",
}
HWMON_LINKS = {
    "sys/class/hwmon/hwmon2": "../../devices/platform/coretemp.0/hwmon/hwmon2",
    "sys/devices/platform/coretemp.0/hwmon/hwmon2/device": "../../../coretemp.0",
    "sys/class/hwmon/hwmon9": "../../devices/gone/hwmon9",  # dangling
}


def test_hwmon_exotic_chips_match_node_exporter(node_exporter_binary: str, tmp_path: Path) -> None:
    root = make_host(tmp_path, HWMON_EXOTIC, HWMON_LINKS)
    their_text, _ = against_oracle(root, "hwmon")
    assert success(their_text, "hwmon") == 0  # the dangling hwmon9 is the last symlink: its stat error stays
    assert 'node_hwmon_chip_names{chip="w83627ehf_chip",chip_name="w83627ehf_chip"} 1' in their_text
    assert 'node_hwmon_temp_input_celsius{chip="w83627ehf_chip",sensor="temp1"} 42' in their_text
    assert 'node_hwmon_temp_celsius{chip="platform_coretemp_0",sensor="temp1"} 44' in their_text


def test_hwmon_device_that_is_a_file_fails_that_chip_only(node_exporter_binary: str, tmp_path: Path) -> None:
    files = {
        "sys/class/hwmon/hwmon0/name": "nvme\n",
        "sys/class/hwmon/hwmon0/device": "not a directory\n",
        "sys/class/hwmon/hwmon1/name": "acpitz\n",
        "sys/class/hwmon/hwmon1/temp1_input": "27800\n",
    }
    their_text, our_text = against_oracle(make_host(tmp_path, files), "hwmon")
    assert success(their_text, "hwmon") == 0
    assert 'chip="acpitz"' in our_text  # the healthy chip is still served


@pytest.mark.parametrize(
    ("order", "ok"),
    [
        (("bad", "good"), 1),  # the good chip's resolved symlink clears the earlier chip's error
        (("good", "bad"), 0),
        (("dangling", "good"), 1),
        (("good", "dangling"), 0),
    ],
)
def test_hwmon_error_is_the_last_one_seen(
    node_exporter_binary: str, tmp_path: Path, order: tuple[str, str], ok: int
) -> None:
    files = {
        "sys/devices/platform/bad/hwmon/hwmon0/name": "bad\n",
        "sys/devices/platform/bad/hwmon/hwmon0/device": "a file where the device link belongs\n",
        "sys/devices/platform/good/hwmon/hwmon1/name": "good\n",
        "sys/devices/platform/good/hwmon/hwmon1/temp1_input": "30000\n",
    }
    targets = {"bad": "platform/bad/hwmon/hwmon0", "good": "platform/good/hwmon/hwmon1", "dangling": "platform/gone"}
    links = {f"sys/class/hwmon/hwmon{i}": f"../../devices/{targets[kind]}" for i, kind in enumerate(order)}
    their_text, _ = against_oracle(make_host(tmp_path, files, links), "hwmon")
    assert success(their_text, "hwmon") == ok


def test_hwmon_absent_is_no_data(node_exporter_binary: str, tmp_path: Path) -> None:
    their_text, _ = against_oracle(make_host(tmp_path, {}), "hwmon")
    assert success(their_text, "hwmon") == 0


def _zone(n: int, temp: str = "40000\n", **extra: str) -> dict[str, str]:
    base = f"sys/class/thermal/thermal_zone{n}"
    files = {f"{base}/type": "x86_pkg_temp\n", f"{base}/policy": "step_wise\n", f"{base}/temp": temp}
    return files | {f"{base}/{k}": v for k, v in extra.items()}


def _cooling(n: int, cur: str = "0\n", top: str = "3\n") -> dict[str, str]:
    base = f"sys/class/thermal/cooling_device{n}"
    return {f"{base}/type": "Processor\n", f"{base}/cur_state": cur, f"{base}/max_state": top}


@pytest.mark.parametrize(
    ("name", "files", "ok"),
    [
        ("absent", {}, 1),
        ("mode and passive optional", _zone(0) | _zone(1, mode="disabled\n", passive="95000\n") | _cooling(0), 1),
        ("negative temperature", _zone(0, "-5500\n") | _cooling(0, "-1\n", "50\n"), 1),
        ("no policy", {k: v for k, v in _zone(0).items() if not k.endswith("policy")} | _zone(1), 0),
        ("malformed temp", _zone(0, "hot\n") | _zone(1), 0),
        ("malformed passive", _zone(0, passive="-1\n"), 0),
        ("malformed cooling device after the zones", _zone(0) | _cooling(0) | _cooling(1, top="many\n"), 0),
        ("cooling device without cur_state", _zone(0) | {"sys/class/thermal/cooling_device0/type": "Fan\n"}, 0),
    ],
)
def test_thermal_zone_matches_node_exporter(
    node_exporter_binary: str, tmp_path: Path, name: str, files: dict[str, str], ok: int
) -> None:
    their_text, _ = against_oracle(make_host(tmp_path, files), "thermal_zone")
    assert success(their_text, "thermal_zone") == ok, name


def _rapl(entry: str, name: str, energy: str = "1000000\n", top: str | None = "262143328850\n") -> dict[str, str]:
    base = f"sys/class/powercap/{entry}"
    files = {f"{base}/name": name + "\n", f"{base}/energy_uj": energy}
    return files | ({f"{base}/max_energy_range_uj": top} if top is not None else {})


@pytest.mark.parametrize(
    ("name", "files", "ok"),
    [
        ("absent", {}, 0),
        ("empty", {"sys/class/powercap/": "/"}, 1),
        (
            "duplicates, sub-zones and odd names",
            _rapl("intel-rapl:0", "package-0")
            | _rapl("intel-rapl:0:0", "core")
            | _rapl("intel-rapl:0:1", "uncore")
            | _rapl("intel-rapl:1", "package-1")
            | _rapl("intel-rapl:1:0", "core")
            | _rapl("intel-rapl-mmio:0", "package-0")
            | _rapl("intel-rapl:2", "psys")
            | _rapl("intel-rapl:3", "dram-a-b", "123456789012345\n")
            | {"sys/class/powercap/intel-rapl/enabled": "1\n"},
            1,
        ),
        (
            "no max_energy_range_uj",
            _rapl("intel-rapl:0", "package-0") | _rapl("intel-rapl:1", "package-1", top=None),
            0,
        ),
        (
            "malformed energy after a good zone",
            _rapl("intel-rapl:0", "package-0") | _rapl("intel-rapl:1", "d", "x\n"),
            0,
        ),
    ],
)
def test_rapl_matches_node_exporter(
    node_exporter_binary: str, tmp_path: Path, name: str, files: dict[str, str], ok: int
) -> None:
    their_text, _ = against_oracle(make_host(tmp_path, files), "rapl")
    assert success(their_text, "rapl") == ok, name


def _mc(n: int, ce: str = "3\n", rows: dict[str, dict[str, str]] | None = None) -> dict[str, str]:
    base = f"sys/devices/system/edac/mc/mc{n}"
    files = {f"{base}/ce_count": ce, f"{base}/ce_noinfo_count": "1\n", f"{base}/ue_count": "0\n"}
    files[f"{base}/ue_noinfo_count"] = "0\n"
    for row, values in (rows or {}).items():
        files |= {f"{base}/{row}/{k}": v for k, v in values.items()}
    return files


@pytest.mark.parametrize(
    ("name", "files", "ok"),
    [
        ("absent", {}, 1),
        ("rows", _mc(0, rows={"csrow0": {"ce_count": "2\n", "ue_count": "0\n"}}) | _mc(1) | _mc(10), 1),
        ("csrow without counts", _mc(0, rows={"csrow0": {"size_mb": "8192\n"}}) | _mc(1), 0),
        ("malformed count", _mc(0, ce="-1\n"), 0),
        ("rank directories are not read", _mc(0, rows={"rank0": {"dimm_ce_count": "1\n"}}), 1),
    ],
)
def test_edac_matches_node_exporter(
    node_exporter_binary: str, tmp_path: Path, name: str, files: dict[str, str], ok: int
) -> None:
    their_text, _ = against_oracle(make_host(tmp_path, files), "edac")
    assert success(their_text, "edac") == ok, name


BATTERY = {
    "type": "Battery\n",
    "status": "Discharging\n",
    "present": "1\n",
    "technology": "Li-ion\n",
    "cycle_count": "0x2a\n",  # procfs parses integers in Go's base-0 syntax
    "voltage_min_design": "11400000\n",
    "voltage_now": "12134000\n",
    "current_now": "1474000\n",
    "charge_full_design": "4400000\n",
    "charge_full": "4097000\n",
    "charge_now": "3350000\n",
    "power_now": "17880000\n",
    "energy_now": "38190000\n",
    "capacity": "81\n",
    "capacity_level": "Normal\n",
    "temp": "296\n",
    "time_to_empty_now": "8400\n",
    "model_name": "5B10W13975\n",
    "manufacturer": "SMP\n",
    "serial_number": "  \n",  # empty after trimming: no label
    "current_avg": "1500000\n",  # parsed, not exported
    "uevent": "POWER_SUPPLY_NAME=BAT0\n",
}


@pytest.mark.parametrize(
    ("name", "files", "ok"),
    [
        ("absent", {}, 0),
        ("empty", {"sys/class/power_supply/": "/"}, 1),
        ("battery and mains", {f"sys/class/power_supply/BAT0/{k}": v for k, v in BATTERY.items()}, 1),
        (
            "malformed integer",
            {"sys/class/power_supply/AC/online": "yes\n", "sys/class/power_supply/AC/type": "Mains\n"},
            0,
        ),
        ("empty integer", {"sys/class/power_supply/AC/online": "\n"}, 0),
        ("not a directory", {"sys/class/power_supply/AC": "x\n"}, 0),
    ],
)
def test_powersupplyclass_matches_node_exporter(
    node_exporter_binary: str, tmp_path: Path, name: str, files: dict[str, str], ok: int
) -> None:
    if name == "battery and mains":
        files = files | {"sys/class/power_supply/AC/online": "0\n", "sys/class/power_supply/AC/type": "Mains\n"}
    their_text, _ = against_oracle(make_host(tmp_path, files), "powersupplyclass")
    assert success(their_text, "powersupplyclass") == ok, name


def test_gpunode_has_every_sensor_family(node_exporter_binary: str) -> None:
    """The fixture exercises the families we care about, and node_exporter reports them all as successes."""
    root = HOSTS / "gpunode"
    their_text = theirs(root, options_for(root), GROUP)
    names = set(parse(their_text))
    for want in (
        "node_hwmon_chip_names",
        "node_hwmon_sensor_label",
        "node_hwmon_temp_celsius",
        "node_hwmon_temp_crit_alarm_celsius",
        "node_hwmon_fan_min_rpm",
        "node_hwmon_fan_alarm",
        "node_hwmon_in_max_volts",
        "node_hwmon_power_average_watt",
        "node_thermal_zone_temp",
        "node_cooling_device_cur_state",
        "node_cooling_device_max_state",
        "node_rapl_package_joules_total",
        "node_rapl_dram_joules_total",
        "node_edac_correctable_errors_total",
        "node_edac_uncorrectable_errors_total",
        "node_edac_csrow_correctable_errors_total",
        "node_edac_csrow_uncorrectable_errors_total",
        "node_power_supply_online",
        "node_power_supply_info",
    ):
        assert want in names, want
    for collector in GROUP:
        assert success(their_text, collector) == 1, collector


# ---- options node_exporter 1.5.0 lacks or our config does not carry ------------------------------------------


def test_hwmon_chip_filters(node_exporter_binary: str) -> None:
    """node_exporter 1.5.0 has no --collector.hwmon.chip-include/-exclude (1.7 added them), so the filtered surface
    is checked against node_exporter's unfiltered output with the other chips taken out."""
    root = HOSTS / "gpunode"
    full = parse(theirs(root, options_for(root), ["hwmon"]))
    for include, exclude in (("coretemp", ""), ("", "^(nvme|power_supply)_"), ("platform_", "it87")):
        pattern_in, pattern_ex = re.compile(include), re.compile(exclude)
        options = options_for(root, hwmon={"chipInclude": include, "chipExclude": exclude})
        got = parse(ours(root, options, ["hwmon"]))
        for name, fam in full.items():
            if not name.startswith("node_hwmon_"):
                continue
            want = {
                labels: v
                for labels, v in fam.samples.items()
                if (not include or pattern_in.search(dict(labels)["chip"]))
                and not (exclude and pattern_ex.search(dict(labels)["chip"]))
            }
            assert (got[name].samples if name in got else {}) == want, (include, exclude, name)


def test_rapl_zone_label_and_ignored_supplies(node_exporter_binary: str) -> None:
    root = HOSTS / "gpunode"
    ctx = NodeContext(HostRoots.under(root), NodeExporterConfig(enabled=True))
    flags = flags_for(root, options_for(root), ["rapl", "powersupplyclass"])
    flags += ["--collector.rapl.enable-zone-label", "--collector.powersupply.ignored-supplies=^A"]
    with node_exporter(flags) as url:
        their_text = scrape(url)
    out: list[Family] = []
    collect_zones(ctx, out, zone_label=True)
    collect_supplies(ctx, out, ignored=re.compile("^A"))
    our_text = render(merge(out)).decode()
    assert "rapl_zone=" in our_text
    # node_exporter's own scrape families aside, the two expositions are the same
    their_text = "\n".join(line for line in their_text.splitlines() if "node_scrape_collector_" not in line)
    assert compare(their_text, our_text) == []


# ---- faults a fixture cannot hold ----------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultyContext(NodeContext):
    """Reads raise the given error for paths ending in a key (root reads a mode-000 file, so no chmod here)."""

    faults: dict[str, OSError] = field(default_factory=dict)

    def read(self, path: HostPath) -> str:
        for suffix, exc in self.faults.items():
            if str(path).endswith(suffix):
                raise exc
        return super().read(path)


def run(collector: str, faults: dict[str, OSError], root: Path = HOSTS / "gpunode") -> tuple[bool, str]:
    """(success, exposition) of one collector on ``root`` with the faults injected."""
    ctx = FaultyContext(HostRoots.under(root), NodeExporterConfig(enabled=True), faults)
    out: list[Family] = []
    try:
        TABLE[collector]().collect(ctx, out)
        ok = True
    except Exception:  # NotPresent included: either way node_scrape_collector_success is 0
        ok = False
    return ok, render(merge(out)).decode()


def test_hwmon_unreadable_files_cost_only_themselves() -> None:
    ok, text = run(
        "hwmon", {"hwmon0/temp2_input": OSError(errno.EIO, "I/O error"), "/temp1_crit": OSError(errno.EAGAIN, "again")}
    )
    assert ok
    assert 'node_hwmon_temp_celsius{chip="platform_coretemp_0",sensor="temp2"}' not in text
    assert 'node_hwmon_temp_celsius{chip="platform_coretemp_0",sensor="temp3"} 40' in text
    crit = {dict(labels)["sensor"] for labels in parse(text)["node_hwmon_temp_crit_celsius"].samples}
    assert "temp1" not in crit and "temp10" in crit  # every temp1_crit failed, temp10_crit did not


def test_thermal_zone_enodata_skips_the_zone() -> None:
    ok, text = run("thermal_zone", {"thermal_zone1/temp": OSError(errno.ENODATA, "No data available")})
    assert ok
    assert 'zone="1"' not in text and 'zone="2"' in text


def test_thermal_zone_other_errors_fail_before_anything() -> None:
    ok, text = run("thermal_zone", {"thermal_zone1/temp": OSError(errno.EIO, "I/O error")})
    assert not ok and text == ""
    ok, text = run("thermal_zone", {"thermal_zone1/mode": PermissionError(errno.EACCES, "denied")})
    assert ok  # optional attributes may be forbidden


def test_rapl_energy_permission_denied() -> None:
    """node_exporter returns ErrNoData (success 0, logged at debug) on the first unreadable energy_uj; the zones
    read before it were already sent."""
    ok, text = run("rapl", {"intel-rapl:1/energy_uj": PermissionError(errno.EACCES, "Permission denied")})
    assert not ok
    # class/powercap in order: intel-rapl (no zone), intel-rapl:0, intel-rapl:0:0, then the failing intel-rapl:1
    families = parse(text)
    assert [dict(k)["index"] for k in families["node_rapl_package_joules_total"].samples] == ["0"]
    assert [dict(k)["index"] for k in families["node_rapl_dram_joules_total"].samples] == ["0"]
    ok, text = run("rapl", {"intel-rapl:0/energy_uj": PermissionError(errno.EACCES, "Permission denied")})
    assert not ok and "node_rapl_package" not in text


def test_rapl_max_energy_range_unreadable_fails_with_nothing() -> None:
    ok, text = run("rapl", {"intel-rapl:1:0/max_energy_range_uj": PermissionError(errno.EACCES, "denied")})
    assert not ok and text == ""


def test_powersupply_skips_what_the_device_cannot_report() -> None:
    read_error = OSError(errno.EOPNOTSUPP, "Operation not supported")  # from read(2): no file name
    ok, text = run("powersupplyclass", {"AC/online": read_error})
    assert ok and "node_power_supply_online" not in text and "node_power_supply_info" in text
    ok, _ = run("powersupplyclass", {"AC/online": OSError(errno.EINVAL, "Invalid argument", "online")})
    assert ok
    ok, _ = run("powersupplyclass", {"AC/online": OSError(errno.EOPNOTSUPP, "Operation not supported", "online")})
    assert not ok  # from open(2): procfs compares the whole message, which then names the file
    ok, text = run("powersupplyclass", {"AC/online": OSError(errno.ENODATA, "No data available")})
    assert not ok and text == ""


def test_edac_unreadable_count_fails_after_earlier_series() -> None:
    ok, text = run("edac", {"mc1/csrow1/ue_count": OSError(errno.EIO, "I/O error")})
    assert not ok
    families = parse(text)
    assert families["node_edac_csrow_correctable_errors_total"].samples[(("controller", "1"), ("csrow", "1"))] == 4
    uncorrectable = families["node_edac_csrow_uncorrectable_errors_total"].samples
    assert (("controller", "1"), ("csrow", "1")) not in uncorrectable
    assert (("controller", "1"), ("csrow", "0")) in uncorrectable


def test_group_matches_on_every_fixture_host_in_process() -> None:
    """No oracle needed: every collector of the group runs on every fixture host and succeeds where the host has
    its source (healthy and faulty have no class/power_supply: ErrNoData, as node_exporter says; nor thermal zones
    or EDAC, which is a success with nothing), with hwmon and rapl series out (the oracle tests compare values)."""
    for host in ("healthy", "faulty", "gpunode"):
        root = HOSTS / host
        fams = parse(collect_once(HostRoots.under(root), options_for(root), TABLE, list(GROUP)).decode())
        got = {dict(k)["collector"]: v for k, v in fams["node_scrape_collector_success"].samples.items()}
        assert got == {c: float(host == "gpunode" or c != "powersupplyclass") for c in GROUP}, host
        for prefix in ("node_hwmon_", "node_rapl_"):
            assert any(name.startswith(prefix) for name in fams), (host, prefix)
