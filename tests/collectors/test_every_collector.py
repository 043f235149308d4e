"""The cases every collector has, one table each: an absent source is ``NotPresent``; a source with nothing usable in
it fails the whole gather; a parser rejects text without a usable line; any text, and any damaged copy of a fixture
file, parses or raises ``ParseError`` and nothing else. The cases that are one collector's own stay in its file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import Collector, HostRoots, NotPresent, ParseError
from nvdaemon.collectors.cpu import CpuCollector, parse_stat
from nvdaemon.collectors.diskstats import DiskStatsCollector, parse_diskstats
from nvdaemon.collectors.hwmon import HwmonCollector, parse_sensor_value
from nvdaemon.collectors.loadavg import LoadAvgCollector, parse_loadavg
from nvdaemon.collectors.memory import MemoryCollector, parse_meminfo
from nvdaemon.collectors.netdev import NetDevCollector, parse_netdev
from nvdaemon.collectors.pcie_aer import PcieAerCollector, parse_aer
from nvdaemon.collectors.pressure import PressureCollector, parse_pressure
from nvdaemon.collectors.rapl import RaplCollector, parse_energy
from tests.collectors.conftest import FAULTY, HEALTHY, copy_host, damaged, fixture_text
from tests.collectors.test_hwmon import failing_reader
from tests.collectors.test_pcie_aer import AER_DEVICES, GPU

PCI = ("sys", "bus", "pci", "devices")
POWERCAP = ("sys", "class", "powercap")
ZONES = ("intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1")
TOTALS = ("TOTAL_ERR_COR", "TOTAL_ERR_NONFATAL", "TOTAL_ERR_FATAL")


def unchanged(root: Path) -> None:
    pass


@dataclass(frozen=True)
class Host:
    """A host root for a case: ``None`` is an empty directory, else a private copy of that fixture host; ``change``
    then edits it (paths under the root, e.g. ``root / "proc" / "loadavg"``)."""

    name: str | None
    change: Callable[[Path], None] = unchanged

    def make(self, tmp_path: Path) -> HostRoots:
        if self.name is None:
            root = tmp_path / "empty"
            root.mkdir()
            roots = HostRoots.under(root)
        else:
            roots = copy_host(tmp_path, self.name)
        self.change(roots.rootfs)
        return roots


def write(rel: str, text: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        (root / rel).write_text(text)

    return change


def write_each(pattern: str, text: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        paths = list(root.glob(pattern))
        assert paths, pattern
        for path in paths:
            path.write_text(text)

    return change


# ---- an absent source is NotPresent ---------------------------------------------------------------------------


def empty_hwmon_class(root: Path) -> None:
    hwmon = root.joinpath("sys", "class", "hwmon")
    shutil.rmtree(hwmon)
    hwmon.mkdir()


def no_aer_capable_device(root: Path) -> None:
    pci = root.joinpath(*PCI)
    for device in AER_DEVICES:
        shutil.rmtree(pci / device)
    assert (pci / "0000:00:1f.0").is_dir()  # a PCI device is left, without AER files


def empty_pressure_dir(root: Path) -> None:
    (root / "proc" / "pressure").mkdir(parents=True)


def only_an_mmio_zone(root: Path) -> None:
    powercap = root.joinpath(*POWERCAP)
    for zone in ZONES:
        shutil.rmtree(powercap / zone)
    (powercap / "intel-rapl-mmio:0").mkdir()  # another interface to the package zone: not counted


EMPTY = Host(None)
NOT_PRESENT = [
    pytest.param(CpuCollector, EMPTY, id="cpu"),
    pytest.param(DiskStatsCollector, EMPTY, id="diskstats"),
    pytest.param(HwmonCollector, EMPTY, id="hwmon"),
    pytest.param(HwmonCollector, Host("healthy", empty_hwmon_class), id="hwmon-empty-class-dir"),
    pytest.param(LoadAvgCollector, EMPTY, id="loadavg"),
    pytest.param(MemoryCollector, EMPTY, id="memory"),
    pytest.param(NetDevCollector, EMPTY, id="netdev"),
    pytest.param(PcieAerCollector, EMPTY, id="pcie_aer"),
    pytest.param(PcieAerCollector, Host("healthy", no_aer_capable_device), id="pcie_aer-no-aer-device"),
    pytest.param(PressureCollector, EMPTY, id="pressure"),
    pytest.param(PressureCollector, Host(None, empty_pressure_dir), id="pressure-empty-dir"),
    pytest.param(RaplCollector, EMPTY, id="rapl"),
    pytest.param(RaplCollector, Host("faulty", only_an_mmio_zone), id="rapl-only-mmio-zone"),
]


@pytest.mark.parametrize(("make", "host"), NOT_PRESENT)
def test_an_absent_source_is_not_present(tmp_path: Path, make: Callable[[], Collector], host: Host) -> None:
    with pytest.raises(NotPresent):
        make().gather(host.make(tmp_path))


@pytest.mark.parametrize(("make", "host"), [p for p in NOT_PRESENT if p.values[0] in (HwmonCollector, RaplCollector)])
def test_a_source_that_may_hang_says_it_is_absent_before_the_gather(
    tmp_path: Path, make: Callable[[], Collector], host: Host
) -> None:
    """hwmon and RAPL (reads that may hang, so gathered in a worker thread) tell the cycle on the loop, from a
    directory listing, that the node has no such source: the cycle then starts no thread for them."""
    assert make().present(host.make(tmp_path)) is False


@pytest.mark.parametrize("make", [HwmonCollector, RaplCollector])
@pytest.mark.parametrize("roots", [HEALTHY, FAULTY], ids=["healthy", "faulty"])
def test_a_source_the_node_has_is_present(make: Callable[[], Collector], roots: HostRoots) -> None:
    assert make().present(roots) is True


# ---- a source with nothing usable fails the gather ------------------------------------------------------------

LOADAVG_BAD = ("", "0.52 0.61", "0.52 0.61 0.58 2-1024 1", "nan 0.61 0.58 2/1024 1", "a b c d")
MEMINFO_BAD = ("", "garbage\n", "MemTotal 123 kB\n")
NOTHING_USABLE = [
    pytest.param(
        DiskStatsCollector, Host("healthy", write("proc/diskstats", "this is not\ndiskstats\n")), id="diskstats"
    ),
    *(
        pytest.param(LoadAvgCollector, Host("healthy", write("proc/loadavg", t)), id=f"loadavg-{t!r}")
        for t in LOADAVG_BAD
    ),
    *(
        pytest.param(MemoryCollector, Host("healthy", write("proc/meminfo", t)), id=f"memory-{t!r}")
        for t in MEMINFO_BAD
    ),
    pytest.param(
        PcieAerCollector,
        Host("faulty", write_each("sys/bus/pci/devices/*/aer_dev_*", "garbage\n")),
        id="pcie_aer-every-file",
    ),
    pytest.param(
        PressureCollector, Host("healthy", write_each("proc/pressure/*", "nonsense\n")), id="pressure-every-file"
    ),
    pytest.param(
        RaplCollector, Host("faulty", write_each("sys/class/powercap/intel-rapl:*/energy_uj", "")), id="rapl-every-zone"
    ),
]


@pytest.mark.parametrize(("make", "host"), NOTHING_USABLE)
def test_nothing_usable_in_the_source_is_a_parse_error(
    tmp_path: Path, make: Callable[[], Collector], host: Host
) -> None:
    with pytest.raises(ParseError):
        make().gather(host.make(tmp_path))


def test_every_sensor_failing_fails_the_gather() -> None:
    """hwmon's form of the same: no sensor read answers (sick I2C hardware), so the gather raises the read error."""
    collector = HwmonCollector(read=failing_reader("_input", "_average", "_crit"))
    with pytest.raises(OSError, match="Input/output error"):
        collector.gather(FAULTY)


# ---- a parser rejects text without a usable line --------------------------------------------------------------


def aer(total: str) -> Callable[[str], tuple[dict[str, int], list[str]]]:
    return lambda text: parse_aer(text, total)


NETDEV_HEADER_ONLY = "\n".join(fixture_text("healthy", "proc/net/dev").splitlines()[:2]) + "\n"
REJECTED: list[tuple[str, Callable[[str], object], tuple[str, ...]]] = [
    ("cpu", parse_stat, ("", "intr 1 2 3\nctxt 5\n", "cpu 1 2 3\n", "cpu a b c d\n")),
    ("netdev", parse_netdev, ("", NETDEV_HEADER_ONLY, "eth0 1 2 3\n", "eth0: 1 2 3\n")),
    ("pcie_aer", aer("TOTAL_ERR_COR"), ("", "\n\n", "TOTAL_ERR_FATAL 0\n", "garbage\n", "RxErr one\n")),
    ("hwmon", parse_sensor_value, ("", "\n", "4.5", "1e3", "--1", "0x10", "١٢")),
    ("rapl", parse_energy, ("", "-1", "1.5", "abc")),
]


@pytest.mark.parametrize(
    ("parse", "text"),
    [pytest.param(parse, t, id=f"{name}-{t!r}") for name, parse, texts in REJECTED for t in texts],
)
def test_a_parser_rejects_text_without_a_usable_line(parse: Callable[[str], object], text: str) -> None:
    with pytest.raises(ParseError):
        parse(text)


# ---- any text, any damaged fixture file: a result or ParseError -----------------------------------------------


def aer_totals_kept_apart(total: str) -> Callable[[Any], bool]:
    """A parse keeps at least one line, and of the TOTAL_ lines only the file's own."""
    return lambda result: bool(result[0]) and all(k == total or not k.startswith("TOTAL_") for k in result[0])


def anything(result: Any) -> bool:
    return True


ANY_TEXT = [
    pytest.param(parse_stat, anything, id="cpu"),
    pytest.param(parse_diskstats, anything, id="diskstats"),
    pytest.param(parse_sensor_value, anything, id="hwmon"),
    pytest.param(parse_loadavg, anything, id="loadavg"),
    pytest.param(parse_meminfo, anything, id="memory"),
    pytest.param(parse_netdev, anything, id="netdev"),
    *(pytest.param(aer(t), aer_totals_kept_apart(t), id=f"pcie_aer-{t}") for t in TOTALS),
    pytest.param(lambda text: parse_pressure(text, "io"), anything, id="pressure"),
    pytest.param(parse_energy, anything, id="rapl"),
]


@pytest.mark.parametrize(("parse", "holds"), ANY_TEXT)
@given(text=st.text())
def test_any_text_parses_or_is_a_parse_error(
    parse: Callable[[str], object], holds: Callable[[Any], bool], text: str
) -> None:
    try:
        result = parse(text)
    except ParseError:
        return
    assert holds(result)


def aer_counts(result: Any) -> bool:
    return all(v >= 0 for v in result[0].values()) and aer_totals_kept_apart("TOTAL_ERR_FATAL")(result)


DAMAGED = [
    pytest.param(
        parse_stat, "healthy", "proc/stat", lambda stat: all(len(t) == 8 for t in stat.times.values()), id="cpu"
    ),
    pytest.param(
        parse_diskstats,
        "healthy",
        "proc/diskstats",
        lambda parsed: all(len(v) in (11, 15, 17) for v in parsed.devices.values()),
        id="diskstats",
    ),
    pytest.param(parse_sensor_value, None, "-273150\n45000\n", anything, id="hwmon"),
    pytest.param(parse_loadavg, "healthy", "proc/loadavg", lambda result: result.load1 >= 0, id="loadavg"),
    pytest.param(
        parse_meminfo, "faulty", "proc/meminfo", lambda info: all(v >= 0 for v in info.values.values()), id="memory"
    ),
    pytest.param(
        parse_netdev,
        "faulty",
        "proc/net/dev",
        lambda parsed: all(len(v) == 16 for v in parsed.interfaces.values()),
        id="netdev",
    ),
    pytest.param(aer("TOTAL_ERR_FATAL"), "faulty", f"{'/'.join(PCI)}/{GPU}/aer_dev_fatal", aer_counts, id="pcie_aer"),
    pytest.param(
        lambda text: parse_pressure(text, "io"),
        "faulty",
        "proc/pressure/io",
        lambda parsed: set(parsed) <= {"some", "full"},
        id="pressure",
    ),
    pytest.param(parse_energy, "healthy", "sys/class/powercap/intel-rapl:0/energy_uj", lambda e: e >= 0, id="rapl"),
]


@pytest.mark.parametrize(("parse", "host", "source", "holds"), DAMAGED)
@given(data=st.data())
def test_a_damaged_fixture_file_parses_or_is_a_parse_error(
    parse: Callable[[str], object], host: str | None, source: str, holds: Callable[[Any], bool], data: st.DataObject
) -> None:
    """``source`` is a file of fixture host ``host`` (or, with no host, the text itself), cut and spliced."""
    text = data.draw(damaged(fixture_text(host, source) if host else source))
    try:
        result = parse(text)
    except ParseError:
        return
    assert holds(result)


def test_the_tables_name_every_core_collector() -> None:
    """A tenth collector gets its rows here too."""
    everyone = {c.name for c in collectors_for_tier("core")}
    for table in (NOT_PRESENT, ANY_TEXT, DAMAGED):
        assert {str(p.id).split("-")[0] for p in table} == everyone
