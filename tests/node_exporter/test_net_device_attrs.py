"""Which network attributes are read once per device and which every time (netclass, infiniband), and netdev's
fast paths against what ``Family.add`` and ``ParseUint`` answer.

A device is its sysfs directory: an attribute fixed for the life of the device (a NIC's ``dev_id``, an HCA's
``fw_ver``) is read again only when the directory is another one (a NIC unplugged and another of the same name
plugged, a driver reloaded). Everything an administrator or the kernel can change while the directory stays
(``address``, ``addr_assign_type``, ``ifindex``, ``type``, ``mtu``, a port's rate) is read on every collection.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nvdaemon.collectors.base import ParseError
from nvdaemon.collectors.bounds import LABEL_MAX
from nvdaemon.compat.node_exporter import netdev
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.compat.node_exporter.netdev import KEYS, add_device_rows, parse_proc_net_dev
from tests.node_exporter.conftest import HOSTS
from tests.node_exporter.exposition import parse
from tests.node_exporter.oracle import options_for, ours

NET = "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/net/eno1"
HCA = "sys/devices/pci0000:a0/0000:a0:01.0/0000:a1:00.0/infiniband/mlx5_0"
ENO1 = (("device", "eno1"),)


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    shutil.copytree(HOSTS / "gpunode", root, symlinks=True)
    return root


def collect(root: Path, collector: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """One collection (one tier cycle, as the agent runs it): family -> samples; the collector must succeed."""
    families = parse(ours(root, options_for(root), [collector]))
    assert families["node_scrape_collector_success"].samples[(("collector", collector),)] == 1.0
    return {name: fam.samples for name, fam in families.items()}


def replace_directory(directory: Path, edits: dict[str, str]) -> None:
    """Another device of the same name: a new directory (a new inode; the old one is kept aside until the new one
    exists, so its inode number cannot be reused) with ``edits`` written into its files."""
    aside = directory.with_name(directory.name + ".gone")
    directory.rename(aside)
    shutil.copytree(aside, directory, symlinks=True)
    assert directory.stat().st_ino != aside.stat().st_ino
    for name, text in edits.items():
        (directory / name).write_text(text)


def test_a_replaced_nic_is_read_afresh(host: Path) -> None:
    first = collect(host, "netclass")
    assert first["node_network_device_id"][ENO1] == 0
    # The same directory: dev_id and dev_port are the driver's, fixed while the device lives, and not read again.
    (host / NET / "dev_id").write_text("0x7\n")
    (host / NET / "dev_port").write_text("5\n")
    assert collect(host, "netclass")["node_network_device_id"][ENO1] == 0
    # Another NIC under the same name (a new directory): its own values, at the next collection.
    replace_directory(host / NET, {"dev_id": "0x2\n", "address": "02:00:00:00:00:02\n"})
    after = collect(host, "netclass")
    assert after["node_network_device_id"][ENO1] == 2
    info = dict(next(labels for labels in after["node_network_info"] if ("device", "eno1") in labels))
    assert info["address"] == "02:00:00:00:00:02"


def test_a_gone_nic_is_gone_at_the_next_collection(host: Path) -> None:
    assert ENO1 in collect(host, "netclass")["node_network_device_id"]
    (host / "sys/class/net/eno1").unlink()
    assert ENO1 not in collect(host, "netclass")["node_network_device_id"]


@pytest.mark.parametrize(
    ("attr", "text", "family", "want"),
    [
        ("addr_assign_type", "3\n", "node_network_address_assign_type", 3),  # ip link set dev X address ...
        ("name_assign_type", "3\n", "node_network_name_assign_type", 3),  # set again by a rename
        ("type", "32\n", "node_network_protocol_type", 32),  # a bond takes its first port's type
        ("ifindex", "99\n", "node_network_iface_id", 99),  # moved to another namespace and back
        ("iflink", "98\n", "node_network_iface_link", 98),  # a veth whose peer moved
        ("mtu", "1500\n", "node_network_mtu_bytes", 1500),
        ("tx_queue_len", "10000\n", "node_network_transmit_queue_length", 10000),
        ("netdev_group", "2\n", "node_network_net_dev_group", 2),
        ("flags", "0x1002\n", "node_network_flags", 4098),
        ("carrier", "0\n", "node_network_carrier", 0),
        ("speed", "10000\n", "node_network_speed_bytes", 1_250_000_000),
    ],
)
def test_changeable_nic_attributes_are_read_every_time(
    host: Path, attr: str, text: str, family: str, want: float
) -> None:
    assert collect(host, "netclass")[family][ENO1] != want
    (host / NET / attr).write_text(text)  # the same directory: the device has not changed
    assert collect(host, "netclass")[family][ENO1] == want


@pytest.mark.parametrize(
    ("attr", "text", "label"),
    [
        ("address", "02:00:00:00:00:09\n", "address"),
        ("broadcast", "00:00:00:00:00:00\n", "broadcast"),
        ("ifalias", "uplink B\n", "ifalias"),
        ("operstate", "down\n", "operstate"),
        ("duplex", "half\n", "duplex"),
    ],
)
def test_changeable_nic_labels_are_read_every_time(host: Path, attr: str, text: str, label: str) -> None:
    collect(host, "netclass")
    (host / NET / attr).write_text(text)
    info = collect(host, "netclass")["node_network_info"]
    labels = dict(next(labels for labels in info if ("device", "eno1") in labels))
    assert labels[label] == text.strip()


def test_a_replaced_hca_is_read_afresh_and_its_ports_every_time(host: Path) -> None:
    def firmware(samples: dict[str, dict[tuple[tuple[str, str], ...], float]]) -> str:
        return dict(next(iter(samples["node_infiniband_info"])))["firmware_version"]

    before = firmware(collect(host, "infiniband"))
    (host / HCA / "fw_ver").write_text("99.99.9999\n")  # the same HCA directory: fixed, not read again
    port = host / HCA / "ports/1"
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")  # a port's rate and state change with its link
    (port / "state").write_text("1: DOWN\n")
    samples = collect(host, "infiniband")
    assert firmware(samples) == before
    port_labels = (("device", "mlx5_0"), ("port", "1"))
    assert samples["node_infiniband_rate_bytes_per_second"][port_labels] == 25_000_000_000
    assert samples["node_infiniband_state_id"][port_labels] == 1
    replace_directory(host / HCA, {"fw_ver": "28.39.1002\n"})  # the HCA registered again (a firmware reset)
    assert firmware(collect(host, "infiniband")) == "28.39.1002"


def test_a_gone_hca_fails_the_collector(host: Path) -> None:
    collect(host, "infiniband")
    shutil.rmtree(host / HCA)  # the class link is left dangling
    text = ours(host, options_for(host), ["infiniband"])
    assert parse(text)["node_scrape_collector_success"].samples[(("collector", "infiniband"),)] == 0.0


HEADER = "Inter-|   Receive\n face |bytes\n"


@pytest.mark.parametrize(
    ("value", "want"),
    [
        ("18446744073709551615", 2**64 - 1),  # 20 digits: past the fast path, still a uint64
        ("999999999999999999", 10**18 - 1),  # 18 digits: the fast path's longest
        ("007", 7),  # ParseUint base 10 takes leading zeros
    ],
)
def test_proc_net_dev_counters_as_parse_uint(value: str, want: int) -> None:
    line = "  eth0: " + " ".join([value] + ["1"] * 15) + "\n"
    assert parse_proc_net_dev(HEADER + line)["eth0"] == (want,) + (1,) * 15


@pytest.mark.parametrize("value", ["18446744073709551616", "+1", "1_0", "\u0661"])  # overflow, sign, _, Arabic 1
def test_proc_net_dev_counters_parse_uint_refuses(value: str) -> None:
    with pytest.raises(ParseError):
        parse_proc_net_dev(HEADER + "  eth0: " + " ".join([value] + ["1"] * 15) + "\n")


def families() -> list[Family]:
    return [Family(f"node_network_{key}_total", "h", "counter") for key in KEYS]


def test_add_device_rows_is_family_add() -> None:
    rows = [("eth0", tuple(range(16))), ("lo", tuple(range(100, 116)))]
    fast, slow = families(), families()
    add_device_rows(fast, rows)
    for name, values in rows:
        for fam, value in zip(slow, values, strict=True):
            fam.add(value, device=name)
    assert [f.samples for f in fast] == [f.samples for f in slow]


def test_add_device_rows_refuses_what_family_add_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    long_name = "e" * (LABEL_MAX + 1)
    with pytest.raises(ParseError):
        families()[0].add(1, device=long_name)
    with pytest.raises(ParseError):
        add_device_rows(families(), [(long_name, (1,) * 16)])
    monkeypatch.setattr(netdev, "SAMPLES_MAX", 2)
    with pytest.raises(ParseError):
        add_device_rows(families(), [(f"e{i}", (1,) * 16) for i in range(3)])
    add_device_rows(families(), [(f"e{i}", (1,) * 16) for i in range(2)])
