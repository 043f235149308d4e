from __future__ import annotations

import errno
import os
from collections.abc import Callable

import pytest

from nvdaemon.collectors.base import HostRoots, read_text
from nvdaemon.collectors.hwmon import HwmonCollector, parse_sensor_value
from nvdaemon.model import Kind, Sample
from tests.collectors.conftest import FAULTY, HEALTHY, HOSTS, collect, value

CORETEMP_FILES = sum(1 for _ in (HOSTS / "faulty" / "sys" / "class" / "hwmon" / "hwmon0").iterdir())


def failing_reader(*suffixes: str, inside: str = "", err: int = errno.EIO) -> Callable[[str], str]:
    """A reader that fails like sick I2C hardware for files ending with one of ``suffixes`` or under ``inside``."""

    def read(path: str) -> str:
        if any(str(path).endswith(n) for n in suffixes) or (inside and f"/{inside}/" in str(path)):
            raise OSError(err, os.strerror(err), str(path))
        return read_text(path)

    return read


def temps(samples: list[Sample]) -> dict[str, float]:
    return {s.device: s.value for s in samples if s.metric == "temp_celsius"}


def test_healthy_through_symlinks() -> None:
    assert (HEALTHY.sys / "class" / "hwmon" / "hwmon0").is_symlink()  # the real sysfs layout
    gathered, samples = collect(HwmonCollector(), HEALTHY)
    assert gathered.errors == []
    assert value(samples, "temp_celsius", "hwmon0/coretemp/temp1") == 45.0
    assert value(samples, "temp_crit_celsius", "hwmon0/coretemp/temp1") == 100.0
    assert value(samples, "temp_celsius", "hwmon0/coretemp/temp4") == 46.0
    assert value(samples, "temp_celsius", "hwmon1/nvme/temp1") == 38.85
    assert value(samples, "temp_crit_celsius", "hwmon1/nvme/temp1") == 84.85
    assert value(samples, "fan_rpm", "hwmon2/nct6775/fan2") == 1054
    assert value(samples, "voltage_volts", "hwmon2/nct6775/in0") == 0.912
    assert value(samples, "temp_celsius", "hwmon2/nct6775/temp1") == 32.0
    assert value(samples, "power_watts", "hwmon3/ina226/power1") == 22.675
    assert value(samples, "current_amps", "hwmon3/ina226/curr1") == 1.875
    assert value(samples, "voltage_volts", "hwmon3/ina226/in1") == 12.096
    # power_meter only has power1_average.
    assert value(samples, "power_watts", "hwmon4/power_meter/power1") == 187.0
    assert len(temps(samples)) == 8
    assert all(s.kind is Kind.GAUGE for s in samples)
    # The Go agent's series carry no labels beyond node/tier/device; a sensor's label text has its own series.
    assert all(s.labels == () for s in samples if s.metric != "hwmon_sensor_info")
    assert value(samples, "hwmon_sensor_info", "hwmon0/coretemp/temp1", label="Package id 0") == 1
    assert value(samples, "hwmon_sensor_info", "hwmon2/nct6775/temp1", label="SYSTIN") == 1
    assert len([s for s in samples if s.metric == "hwmon_sensor_info"]) == 8  # labelled sensors only


def test_faulty_hot_package() -> None:
    _, samples = collect(HwmonCollector(), FAULTY)
    assert value(samples, "temp_celsius", "hwmon0/coretemp/temp1") == 97.0
    assert value(samples, "temp_crit_celsius", "hwmon0/coretemp/temp1") == 100.0
    assert value(samples, "fan_rpm", "hwmon2/nct6775/fan1") == 0


def test_eio_on_one_sensor_keeps_the_rest() -> None:
    collector = HwmonCollector(read=failing_reader("hwmon0/temp2_input"))
    gathered, samples = collect(collector, FAULTY)
    assert len(gathered.errors) == 1
    assert "hwmon0/temp2_input" in gathered.errors[0] and "Input/output error" in gathered.errors[0]
    found = temps(samples)
    assert "hwmon0/coretemp/temp2" not in found
    assert found["hwmon0/coretemp/temp1"] == 97.0
    assert found["hwmon0/coretemp/temp3"] == 96.0
    # The crit file of the same sensor still read fine.
    assert value(samples, "temp_crit_celsius", "hwmon0/coretemp/temp2") == 100.0


def test_a_whole_chip_failing_keeps_other_chips() -> None:
    collector = HwmonCollector(read=failing_reader(inside="hwmon0", err=errno.ENODATA))
    gathered, samples = collect(collector, FAULTY)
    # name, and per sensor label, input and crit: all 16 files that are read (max, crit_alarm are not).
    assert len(gathered.errors) == 16 < CORETEMP_FILES
    assert all("hwmon0/" in e and "No data available" in e for e in gathered.errors)
    # The chip's name file failed too: its device falls back to the directory name, and no sample survives.
    assert not [s for s in samples if s.device.startswith("hwmon0/")]
    assert value(samples, "temp_celsius", "hwmon1/nvme/temp1") == 71.85


def test_malformed_value_is_an_error(faulty_copy: HostRoots) -> None:
    (faulty_copy.sys / "class" / "hwmon" / "hwmon2" / "fan2_input").write_text("spinning\n")
    gathered, samples = collect(HwmonCollector(), faulty_copy)
    assert len(gathered.errors) == 1 and "fan2_input" in gathered.errors[0]
    assert value(samples, "fan_rpm", "hwmon2/nct6775/fan1") == 0
    assert "hwmon2/nct6775/fan2" not in {s.device for s in samples}


def test_missing_label_only_drops_the_info_series(faulty_copy: HostRoots) -> None:
    (faulty_copy.sys / "class" / "hwmon" / "hwmon1" / "temp1_label").unlink()
    _, samples = collect(HwmonCollector(), faulty_copy)
    assert value(samples, "temp_celsius", "hwmon1/nvme/temp1") == 71.85
    info = {s.device for s in samples if s.metric == "hwmon_sensor_info"}
    assert "hwmon1/nvme/temp1" not in info and "hwmon1/nvme/temp2" in info


def test_device_falls_back_to_the_directory_name_without_a_name_file(faulty_copy: HostRoots) -> None:
    (faulty_copy.sys / "class" / "hwmon" / "hwmon2" / "name").unlink()
    _, samples = collect(HwmonCollector(), faulty_copy)
    assert value(samples, "fan_rpm", "hwmon2/hwmon2/fan1") == 0


def test_power_input_wins_over_average(faulty_copy: HostRoots) -> None:
    (faulty_copy.sys / "class" / "hwmon" / "hwmon3" / "power1_average").write_text("1000000\n")
    _, samples = collect(HwmonCollector(), faulty_copy)
    assert value(samples, "power_watts", "hwmon3/ina226/power1") == 51.4


def test_copied_symlink_tree_still_reads(healthy_copy: HostRoots) -> None:
    assert (healthy_copy.sys / "class" / "hwmon" / "hwmon1").is_symlink()
    _, samples = collect(HwmonCollector(), healthy_copy)
    assert value(samples, "temp_celsius", "hwmon1/nvme/temp2") == 40.85


@pytest.mark.parametrize(("text", "expected"), [("45000\n", 45000), ("-273150\n", -273150), ("0", 0)])
def test_parse_sensor_value(text: str, expected: int) -> None:
    assert parse_sensor_value(text) == expected


def test_older_drivers_keep_name_and_sensors_in_the_device_directory() -> None:
    # gpunode's ACPI power meter (hwmon5) has only device/, power and uevent in its hwmon directory.
    gpunode = HostRoots.under(HOSTS / "gpunode")
    chip = gpunode.sys / "class" / "hwmon" / "hwmon5"
    assert not (chip / "name").exists() and (chip / "device" / "name").exists()
    gathered, samples = collect(HwmonCollector(), gpunode)
    assert gathered.errors == []
    power = [s for s in samples if s.device.startswith("hwmon5/")]
    assert [(s.device, s.metric, s.value) for s in power] == [("hwmon5/power_meter/power1", "power_watts", 1184.0)]
