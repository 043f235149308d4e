"""The smart collector: pySMART really runs against the stand-in smartctl, which answers from recorded outputs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvdaemon.catalogue import HELP
from nvdaemon.collectors import COLLECTORS, collectors_for_tier
from nvdaemon.collectors.base import HostRoots, NotPresent
from nvdaemon.collectors.smart import (
    SmartCollector,
    configured_devices,
    controller_of,
    discover,
    read_device,
    samples_of,
)
from nvdaemon.collectors.smart_report import AtaAttribute, DiskReport, NvmeHealth
from nvdaemon.configload import parse_config
from nvdaemon.model import Kind
from tests.smart.conftest import (
    DEVICES,
    DISKS,
    NOW,
    RECORDINGS,
    ROOT,
    STANDIN,
    Standin,
    by_series,
    collector,
    cycle,
    pid_running,
)

G = Kind.GAUGE  # every smart-tier series is a gauge, as in the Go agent
C = G
SSD = {"model": "Samsung SSD 870 EVO 1TB", "serial": "S6PTNM0T512345A", "firmware": "SVT02B6Q"}
HDD = {"model": "ST4000DM004-2CV104", "serial": "ZFN0ABCD", "firmware": "0001"}
NVME = {"model": "Samsung SSD 980 PRO 2TB", "serial": "S6B0NL0T123456X", "firmware": "5B2QGXA7"}
WORN = {"model": "INTEL SSDPE2KX020T8", "serial": "PHLJ912345672P0BGN", "firmware": "VDV10184"}

# (metric, device) -> (value, kind), straight from the recordings in fixtures/smartctl/recordings.
EXPECTED: dict[tuple[str, str], tuple[float, Kind]] = {
    ("smart_temperature_celsius", "sda"): (34, G),
    ("smart_power_on_hours", "sda"): (12345, C),
    ("smart_power_cycles", "sda"): (87, C),
    ("smart_reallocated_sectors", "sda"): (0, C),
    ("smart_reported_uncorrectable", "sda"): (0, C),
    ("smart_health_passed", "sda"): (1, G),
    ("smart_error_log_count", "sda"): (0, C),
    ("smart_capacity_bytes", "sda"): (1_000_204_886_016, G),
    ("smart_logical_block_size_bytes", "sda"): (512, G),
    ("smart_interface_speed_bits_per_second", "sda"): (6e9, G),  # solid state: no rotation rate
    ("smart_temperature_celsius", "sdb"): (41, G),
    ("smart_power_on_hours", "sdb"): (33456, C),
    ("smart_power_cycles", "sdb"): (1201, C),
    ("smart_reallocated_sectors", "sdb"): (1064, C),
    ("smart_reported_uncorrectable", "sdb"): (12, C),
    ("smart_command_timeout", "sdb"): (3, C),
    ("smart_pending_sectors", "sdb"): (24, G),
    ("smart_offline_uncorrectable", "sdb"): (16, G),
    ("smart_health_passed", "sdb"): (1, G),
    ("smart_error_log_count", "sdb"): (37, C),
    ("smart_capacity_bytes", "sdb"): (4_000_787_030_016, G),
    ("smart_logical_block_size_bytes", "sdb"): (512, G),
    ("smart_rotation_rate_rpm", "sdb"): (5425, G),
    ("smart_interface_speed_bits_per_second", "sdb"): (3e9, G),  # the current speed, not the 6 Gb/s maximum
    ("smart_temperature_celsius", "nvme0n1"): (38, G),
    ("smart_power_on_hours", "nvme0n1"): (8765, C),
    ("smart_power_cycles", "nvme0n1"): (210, C),
    ("smart_health_passed", "nvme0n1"): (1, G),
    ("smart_capacity_bytes", "nvme0n1"): (2_000_398_934_016, G),
    ("smart_logical_block_size_bytes", "nvme0n1"): (512, G),
    ("nvme_percentage_used", "nvme0n1"): (2, G),
    ("nvme_available_spare", "nvme0n1"): (100, G),
    ("nvme_available_spare_threshold", "nvme0n1"): (10, G),
    ("nvme_media_errors", "nvme0n1"): (0, C),
    ("nvme_critical_warning", "nvme0n1"): (0, G),
    ("nvme_bytes_read_total", "nvme0n1"): (23_456_789 * 512_000, C),
    ("nvme_bytes_written_total", "nvme0n1"): (34_567_890 * 512_000, C),
    ("nvme_error_log_entries", "nvme0n1"): (0, C),
    ("smart_temperature_celsius", "nvme1n1"): (47, G),
    ("smart_power_on_hours", "nvme1n1"): (41234, C),
    ("smart_power_cycles", "nvme1n1"): (64, C),
    ("smart_health_passed", "nvme1n1"): (0, G),
    ("smart_capacity_bytes", "nvme1n1"): (2_000_398_934_016, G),
    ("smart_logical_block_size_bytes", "nvme1n1"): (4096, G),
    ("nvme_percentage_used", "nvme1n1"): (97, G),
    ("nvme_available_spare", "nvme1n1"): (6, G),
    ("nvme_available_spare_threshold", "nvme1n1"): (10, G),
    ("nvme_media_errors", "nvme1n1"): (14, C),
    ("nvme_critical_warning", "nvme1n1"): (5, G),
    ("nvme_bytes_read_total", "nvme1n1"): (1_234_567_890 * 512_000, C),
    ("nvme_bytes_written_total", "nvme1n1"): (2_345_678_901 * 512_000, C),
    ("nvme_error_log_entries", "nvme1n1"): (2311, C),
}
LABELS = {"sda": SSD, "sdb": HDD, "nvme0n1": NVME, "nvme1n1": WORN}


def test_table_and_config() -> None:
    spec = next(s for s in COLLECTORS if s.name == "smart")
    assert spec.tier == "smart" and spec.default_enabled and spec.description
    [c] = collectors_for_tier("smart")
    assert isinstance(c, SmartCollector)
    text = (
        "tiers: [smart]\n"
        "smart: {smartctlPath: /opt/smartctl, devices: [/dev/sdb, sdc, sdb], timeoutSeconds: 7, maxConcurrent: 2}"
    )
    c.configure(parse_config(text, "t.yaml", {}, None).config)
    assert (c.smartctl_path, c.devices, c.timeout, c.concurrency) == ("/opt/smartctl", ["sdb", "sdc"], 7.0, 2)
    # The gather's own limit allows every smartctl run of every device (2 runs, 2 devices at a time, 7 s each).
    assert c.read_timeout(5.0) == 5.0 + 7.0 * 2 * 1
    c.devices, c._known = [], 5
    assert c.read_timeout(5.0) == 5.0 + 7.0 * 2 * 3


def test_discovery_takes_whole_disks_only(tmp_path: Path) -> None:
    # fixtures/hosts/disks/dev also holds sdb1, nvme0n1p1, nvme0, loop0, dm-0 and sr0.
    assert discover(DISKS.dev) == DEVICES
    for name in ["sdab", "sdz", "sdaa", "nvme10n1", "nvme2n1", "nvme2n2", "sdb3", "vda", "md0"]:
        (tmp_path / name).touch()
    assert discover(tmp_path) == ["sdz", "sdaa", "sdab", "nvme2n1", "nvme2n2", "nvme10n1"]
    with pytest.raises(NotPresent):
        discover(tmp_path / "missing")
    assert configured_devices(["/dev/sda", "nvme0n1", "sda", ""]) == ["sda", "nvme0n1"]
    assert controller_of("nvme12n3") == "nvme12" and controller_of("sdb") == "sdb"


def test_samples_match_the_recordings(standin: Standin) -> None:
    c = collector()
    gathered, samples = cycle(c)
    assert gathered.errors == []
    got = by_series(samples)
    assert set(got) == set(EXPECTED) | {("smart_device_info", d) for d in DEVICES}
    for key, (value, kind) in EXPECTED.items():
        s = got[key]
        assert (s.value, s.kind) == (value, kind), key
        # The Go agent's series carry no labels; the disk's identity is its own series.
        assert s.labels == () and s.tier == "smart" and s.timestamp == NOW
        assert s.metric in HELP, s.metric
    for device, identity in LABELS.items():
        info = got["smart_device_info", device]
        assert (info.value, info.kind, dict(info.labels)) == (1.0, G, identity)
    assert {name: st.readable for name, st in c.status.items()} == dict.fromkeys(DEVICES, True)
    # /v1/status names each disk read this cycle.
    identity = {"model": HDD["model"], "serial": HDD["serial"], "interface": "sat"}
    assert c.detail()["devices"]["sdb"] == {"state": "ok", "readable": True, "parseErrors": 0, **identity}


def test_what_smartctl_is_asked(standin: Standin) -> None:
    c = collector()
    cycle(c)
    dev = str(DISKS.dev)
    first = sorted(standin.runs())
    assert first == sorted(
        [
            ["--nocheck=standby", "-d", "test", f"{dev}/sda"],  # type detection, first cycle only
            ["--nocheck=standby", "-d", "sat", "--all", f"{dev}/sda"],
            ["--nocheck=standby", "-d", "test", f"{dev}/sdb"],
            ["--nocheck=standby", "-d", "sat", "--all", f"{dev}/sdb"],
            ["--nocheck=standby", "-d", "nvme", "--all", f"{dev}/nvme0n1"],  # NVMe by name: no detection
            ["--nocheck=standby", "-d", "nvme", "--all", f"{dev}/nvme1n1"],
        ]
    )
    # The child gets the C locale; the agent's own environment is left alone.
    assert all(" LANG=C LC_ALL=C " in line for line in standin.lines() if line.startswith("RUN "))
    standin.clear()
    cycle(c)
    assert sorted(standin.runs()) == sorted(r for r in first if "test" not in r)  # the detected type is kept


def test_a_sleeping_disk_is_never_woken(standin: Standin) -> None:
    standin.modes(sdb="standby")
    c = collector()
    gathered, samples = cycle(c)
    assert not [line for line in standin.lines() if line.startswith("WOKE")]
    assert c.status["sdb"].state == "standby" and c.status["sdb"].readable
    assert gathered.errors == []  # asleep is not an error
    assert {s.device for s in samples} == {"sda", "nvme0n1", "nvme1n1"}


@pytest.mark.parametrize("mode", ["garbage", "truncated"])
def test_unparseable_output_costs_only_that_device(standin: Standin, mode: str) -> None:
    standin.modes(sda=mode, nvme1n1=mode)
    c = collector()
    for n in (1, 2):
        gathered, samples = cycle(c)
        assert sorted(e.split(":")[0] for e in gathered.errors) == ["nvme1n1", "sda"]
        assert all(": parse error: " in e for e in gathered.errors)
        assert {s.device for s in samples} == {"sdb", "nvme0n1"}
        assert by_series(samples)[("smart_pending_sectors", "sdb")].value == 24
        assert (c.status["sda"].parse_errors, c.status["nvme1n1"].parse_errors, c.status["sdb"].parse_errors) == (
            n,
            n,
            0,
        )
        assert not c.status["sda"].readable


def test_no_cut_of_a_recording_yields_a_wrong_value(tmp_path: Path, standin: Standin) -> None:
    """A torn output is either refused (parse error) or gives exactly the full recording's values."""
    full = by_series(cycle(collector())[1])
    for device in DEVICES:
        lines = (RECORDINGS / device / "all.txt").read_text().splitlines(keepends=True)
        for cut in range(0, len(lines), 12):
            rec = tmp_path / f"{device}-{cut}" / device
            rec.mkdir(parents=True)
            (rec / "all.txt").write_text("".join(lines[:cut]))
            for name in ("type", "rc"):
                (rec / name).write_text((RECORDINGS / device / name).read_text())
            standin.monkeypatch.setenv("SMARTCTL_STANDIN_DIR", str(rec.parent))
            hint = "nvme" if device.startswith("nvme") else "sat"
            o = read_device(device, DISKS.dev / device, hint, str(STANDIN), 10.0)
            assert o.state in ("ok", "parse_error"), (device, cut, o)
            if o.report is not None:
                for s in samples_of(o.report, NOW):
                    assert full[(s.metric, s.device)].value == s.value, (device, cut, s)
            if cut < len(lines) // 2:
                assert o.state == "parse_error", (device, cut)


def test_a_hanging_smartctl_is_killed_and_the_next_cycle_runs(standin: Standin) -> None:
    standin.modes(sdb="hang")
    c = collector(timeout=1.0)
    began = time.monotonic()
    gathered, samples = cycle(c)
    assert time.monotonic() - began < 5
    assert c.status["sdb"].state == "timeout" and not c.status["sdb"].readable
    assert [e for e in gathered.errors if e.startswith("sdb: timeout: smartctl killed after 1s")]
    assert {s.device for s in samples} == {"sda", "nvme0n1", "nvme1n1"}
    [hang] = [line.split() for line in standin.lines() if line.startswith("HANG ")]
    smartctl_pid, child_pid = int(hang[1]), int(hang[2])
    deadline = time.monotonic() + 5
    while (pid_running(smartctl_pid) or pid_running(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_running(smartctl_pid), "smartctl was abandoned, not killed"
    assert not pid_running(child_pid), "smartctl's child survived: the process group was not killed"
    standin.modes()
    gathered, samples = cycle(c)
    assert gathered.errors == [] and c.status["sdb"].readable
    assert by_series(samples)[("smart_reallocated_sectors", "sdb")].value == 1064


@pytest.mark.parametrize(("mode", "reason"), [("denied", "Permission denied"), ("eperm", "Operation not permitted")])
def test_unreadable_is_logged_once_with_the_fix(
    standin: Standin, caplog: pytest.LogCaptureFixture, mode: str, reason: str
) -> None:
    standin.modes(sda=mode)
    c = collector()
    caplog.set_level(logging.INFO, logger="nvdaemon.collectors.smart")
    for _ in range(3):
        gathered, samples = cycle(c)
        assert [e for e in gathered.errors if e.startswith("sda: unreadable: ") and reason in e]
        assert {s.device for s in samples} == {"sdb", "nvme0n1", "nvme1n1"}
    assert c.status["sda"].state == "unreadable" and not c.status["sda"].readable
    detail = c.detail()
    assert detail["unreadable"] == ["sda"] and reason in detail["devices"]["sda"]["reason"]
    assert "model" not in detail["devices"]["sda"] and detail["devices"]["sdb"]["model"] == HDD["model"]
    warned = [r.getMessage() for r in caplog.records if "sda is unreadable" in r.getMessage()]
    assert len(warned) == 1, warned
    assert reason in warned[0] and "CAP_SYS_RAWIO" in warned[0] and "privileged" in warned[0]
    standin.modes()
    cycle(c)
    assert c.status["sda"].readable and c.detail()["unreadable"] == []
    assert [r for r in caplog.records if r.getMessage() == "SMART: sda is readable again"]


def test_smartctl_runs_are_bounded(standin: Standin) -> None:
    standin.modes(sda="slow", sdb="slow", nvme0n1="slow", nvme1n1="slow")
    cycle(collector(concurrency=2))
    events: list[tuple[float, int]] = []
    for line in standin.lines():
        kind, _, stamp = line.split()[:3]
        if kind in ("RUN", "END"):
            events.append((float(stamp), 1 if kind == "RUN" else -1))
    running = peak = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        running += delta
        peak = max(peak, running)
    assert peak == 2


def test_explicit_devices_and_a_missing_one(standin: Standin) -> None:
    c = collector(devices=["sdb", "sdq"])
    _, samples = cycle(c)
    assert {s.device for s in samples} == {"sdb"}
    assert c.status["sdq"].state == "unreadable" and "No such device" in c.status["sdq"].reason


def test_missing_dev_root_is_absent_not_an_error(tmp_path: Path) -> None:
    with pytest.raises(NotPresent):
        collector().gather(HostRoots.under(tmp_path))


def run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_pysmart_side_effects_are_contained() -> None:
    """pySMART sets LANG=C and its logger class on import; in a fresh interpreter, neither survives ours."""
    code = """
import logging, os, sys
os.environ["LANG"] = "de_DE.UTF-8"
os.environ.pop("LC_ALL", None)
cls = logging.getLoggerClass()
import nvdaemon.collectors.smart
from nvdaemon.collectors.smart_edge import import_pysmart
assert "pySMART" not in sys.modules, "pySMART must load lazily, with the smart tier"
import_pysmart()
assert "pySMART" in sys.modules
assert os.environ["LANG"] == "de_DE.UTF-8", os.environ["LANG"]
assert logging.getLoggerClass() is cls
assert type(logging.getLogger("after.pysmart")) is logging.Logger
print("contained")
"""
    env = {k: v for k, v in os.environ.items() if k != "LANG"}
    out = run_python(code, env)
    assert out.returncode == 0 and out.stdout.strip() == "contained", out.stderr
    # ...and without the containment pySMART does change it (so the check above can fail).
    raw = "import os; os.environ['LANG'] = 'de_DE.UTF-8'; import pySMART; print(os.environ['LANG'])"
    out = run_python(raw, env)
    assert out.stdout.strip() == "C"


def _ata(*attrs: AtaAttribute, smartctl_says: bool = True) -> DiskReport:
    return DiskReport("sdx", "sat", "ATA", "m", "s", "f", health_passed=smartctl_says, attributes=attrs)


def _attr(attr_id: int, flags: int, value: int, thresh: int | None) -> AtaAttribute:
    return AtaAttribute(attr_id, "x", flags, value, value, thresh, 0, "0")


def test_health_the_go_agents_way() -> None:
    """ATA: failed when a pre-failure attribute with a threshold is at or below it (old-age ones and threshold 0
    do not count), absent when no such attribute exists; NVMe: critical warning 0."""
    prefail, old_age = 0x0B, 0x32
    health = {s.metric: s.value for s in samples_of(_ata(_attr(5, prefail, 36, 36)), NOW)}
    assert health["smart_health_passed"] == 0  # even though smartctl's self-assessment said PASSED
    assert {s.metric: s.value for s in samples_of(_ata(_attr(5, prefail, 37, 36)), NOW)}["smart_health_passed"] == 1
    passing_old_age = _ata(_attr(5, prefail, 100, 10), _attr(194, old_age, 20, 30), _attr(1, prefail, 1, 0))
    assert {s.metric: s.value for s in samples_of(passing_old_age, NOW)}["smart_health_passed"] == 1
    unjudged = _ata(_attr(194, old_age, 20, 30), _attr(1, prefail, 1, 0), smartctl_says=False)
    assert "smart_health_passed" not in {s.metric for s in samples_of(unjudged, NOW)}
    nvme = NvmeHealth(4, 100, 10, 0, 0, 0, 0, 0)
    report = DiskReport("nvme0n1", "nvme", "NVMe", "m", "s", "f", health_passed=True, nvme=nvme)
    assert {s.metric: s.value for s in samples_of(report, NOW)}["smart_health_passed"] == 0
