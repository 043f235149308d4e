"""What the diskstats, textfile, thermal_zone, nvme and rapl collectors keep from one scrape to the next (udev
entries, parsed text files, fixed device attributes) is replaced as soon as its source is: each test collects
twice, changes the source between the two, and checks that the second collection shows the change."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from nvdaemon.collectors.base import HostRoots, NotPresent
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, merge, render
from nvdaemon.config import NodeExporterConfig


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def scrape(collector: str, root: Path, **options: object) -> str:
    ctx = NodeContext(HostRoots.under(root), msgspec.convert({"enabled": True, **options}, NodeExporterConfig))
    out: list[Family] = []
    TABLE[collector]().collect(ctx, out)
    return render(merge(out)).decode()


DISKSTATS = "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17\n"


def test_a_udev_entry_replaced_by_udev_is_read_again(tmp_path: Path) -> None:
    write(tmp_path, {"proc/diskstats": DISKSTATS, "run/udev/data/b8:0": "E:ID_MODEL=old\n"})
    assert 'model="old"' in scrape("diskstats", tmp_path)
    # udev writes a new file and renames it over the entry: another inode, whatever the times say
    entry = tmp_path / "run/udev/data/b8:0"
    before = entry.stat()
    fresh = tmp_path / "run/udev/data/.tmp"
    fresh.write_text("E:ID_MODEL=new\n")
    os.utime(fresh, ns=(before.st_atime_ns, before.st_mtime_ns))
    fresh.rename(entry)
    assert 'model="new"' in scrape("diskstats", tmp_path)


def test_a_udev_entry_that_goes_away_gives_empty_labels(tmp_path: Path) -> None:
    write(tmp_path, {"proc/diskstats": DISKSTATS, "run/udev/data/b8:0": "E:ID_MODEL=old\n"})
    assert 'model="old"' in scrape("diskstats", tmp_path)
    (tmp_path / "run/udev/data/b8:0").unlink()
    assert 'node_disk_info{device="sda",major="8",minor="0",model="",' in scrape("diskstats", tmp_path)


def test_a_text_file_rewritten_in_place_within_its_mtime_is_parsed_again(tmp_path: Path) -> None:
    prom = tmp_path / "text" / "a.prom"
    write(tmp_path, {"text/a.prom": "x 1\n"})
    stamp = prom.stat().st_mtime_ns
    assert "\nx 1\n" in scrape("textfile", tmp_path, textfileDirectory=str(prom.parent))
    prom.write_text("x 2\n")  # same size, and the same mtime: only the bytes tell
    os.utime(prom, ns=(stamp, stamp))
    second = scrape("textfile", tmp_path, textfileDirectory=str(prom.parent))
    assert "\nx 2\n" in second and "\nx 1\n" not in second


def test_a_text_file_that_stops_parsing_is_an_error_again(tmp_path: Path) -> None:
    prom = tmp_path / "text" / "a.prom"
    write(tmp_path, {"text/a.prom": "x 1\n"})
    assert "node_textfile_scrape_error 0" in scrape("textfile", tmp_path, textfileDirectory=str(prom.parent))
    prom.write_text("x{ 1\n")
    second = scrape("textfile", tmp_path, textfileDirectory=str(prom.parent))
    assert "node_textfile_scrape_error 1" in second and "\nx 1\n" not in second


def test_a_thermal_zone_registered_again_shows_its_new_type(tmp_path: Path) -> None:
    zone = {"policy": "step_wise\n", "temp": "42000\n"}
    write(tmp_path, {f"sys/class/thermal/thermal_zone0/{k}": v for k, v in (zone | {"type": "acpitz\n"}).items()})
    assert 'type="acpitz"' in scrape("thermal_zone", tmp_path)
    directory = tmp_path / "sys/class/thermal/thermal_zone0"
    directory.rename(tmp_path / "gone")  # the driver unregisters it: the old directory is kept, so a new inode
    write(tmp_path, {f"sys/class/thermal/thermal_zone0/{k}": v for k, v in (zone | {"type": "x86_pkg\n"}).items()})
    second = scrape("thermal_zone", tmp_path)
    assert 'type="x86_pkg"' in second and "acpitz" not in second


def test_an_nvme_controller_found_again_shows_its_new_identity_and_firmware(tmp_path: Path) -> None:
    attrs = {"state": "live\n", "firmware_rev": "1.0\n", "model": "A\n", "serial": "S1\n"}
    write(tmp_path, {f"sys/class/nvme/nvme0/{k}": v for k, v in attrs.items()})
    assert 'firmware_revision="1.0",model="A",serial="S1",state="live"' in scrape("nvme", tmp_path)
    write(tmp_path, {"sys/class/nvme/nvme0/firmware_rev": "2.0\n", "sys/class/nvme/nvme0/state": "resetting\n"})
    assert 'firmware_revision="2.0",model="A",serial="S1",state="resetting"' in scrape("nvme", tmp_path)
    (tmp_path / "sys/class/nvme/nvme0").rename(tmp_path / "gone")
    write(tmp_path, {f"sys/class/nvme/nvme0/{k}": v for k, v in (attrs | {"model": "B\n", "serial": "S2\n"}).items()})
    assert 'firmware_revision="1.0",model="B",serial="S2",state="live"' in scrape("nvme", tmp_path)


def test_rapl_reads_max_energy_range_every_time(tmp_path: Path) -> None:
    zone = {"name": "package-0\n", "energy_uj": "1000000\n", "max_energy_range_uj": "262143328850\n"}
    write(tmp_path, {f"sys/class/powercap/intel-rapl:0/{k}": v for k, v in zone.items()})
    assert "node_rapl_package_joules_total" in scrape("rapl", tmp_path)
    (tmp_path / "sys/class/powercap/intel-rapl:0/max_energy_range_uj").unlink()
    with pytest.raises(NotPresent):  # node_scrape_collector_success 0
        scrape("rapl", tmp_path)
