"""The network collectors of the node_exporter surface: netdev, netclass, infiniband, netstat, sockstat, softnet,
conntrack. Parser tables, then malformed and partial host roots (copies of gpunode) checked for our verdict and,
where node_exporter is installed, against node_exporter on the same root."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nvdaemon.collectors.base import ParseError
from nvdaemon.compat.node_exporter.conntrack import parse_conntrack_stat
from nvdaemon.compat.node_exporter.infiniband import parse_rate, parse_state
from nvdaemon.compat.node_exporter.netclass import speed_bytes, sysfs_int
from nvdaemon.compat.node_exporter.netdev import parse_proc_net_dev
from nvdaemon.compat.node_exporter.netstat import parse_pairs, parse_snmp6
from nvdaemon.compat.node_exporter.sockstat import parse_sockstat
from nvdaemon.compat.node_exporter.softnet import parse_softnet
from tests.node_exporter.conftest import HOSTS
from tests.node_exporter.exposition import parse
from tests.node_exporter.oracle import binary, compare, options_for, ours, theirs

GPUNODE = HOSTS / "gpunode"
NET = "sys/devices/pci0000:16/0000:16:02.0/0000:17:00.0/net/eno1"
PORT = "sys/devices/pci0000:a0/0000:a0:01.0/0000:a1:00.0/infiniband/mlx5_0/ports/1"


# ------------------------------------------------------------------------------------------------- parsers
HEADER = "Inter-|   Receive\n face |bytes\n"


def test_parse_proc_net_dev() -> None:
    text = HEADER + "    lo:96381544212 615 0 0 0 0 0 0 96381544212 615 0 0 0 0 0 0\n" + "  e:1: " + "1 " * 16 + "\n"
    devices = parse_proc_net_dev(text)
    assert devices["lo"][0] == 96381544212
    assert devices["e:1"] == (1,) * 16  # the name is what precedes the last colon
    assert parse_proc_net_dev(HEADER) == {}


@pytest.mark.parametrize(
    "line",
    ["eth0 1 2 3", "   : " + "0 " * 16, "eth0: " + "0 " * 15, "eth0: x" + " 0" * 15, "eth0: -1" + " 0" * 15, ""],
)
def test_parse_proc_net_dev_malformed(line: str) -> None:
    with pytest.raises(ParseError):
        parse_proc_net_dev(HEADER + line + "\n")


def test_sysfs_values() -> None:
    assert sysfs_int("0x1003") == 4099
    assert sysfs_int("unknown") == 0  # procfs's PInt64 yields 0 for text that does not parse
    assert speed_bytes(25000) == 3_125_000_000
    assert speed_bytes(-1) == -125_000
    assert speed_bytes(2**50) == 9 * 2**53  # int64 arithmetic: 2**50 * 10**6 keeps 9 * 2**56 of 2**64
    assert speed_bytes(2**54) == -14 * 2**56  # ... and this one wraps negative


def test_parse_softnet() -> None:
    row = " ".join(["0000001f", "00000002", "0000000a"] + ["00000000"] * 10)
    assert parse_softnet(row + "\n" + row + "\n") == [(31, 2, 10), (31, 2, 10)]
    with pytest.raises(ParseError):
        parse_softnet("0000001f 00000002 0000000a 0 0 0 0 0\n")  # 8 columns
    with pytest.raises(ParseError):
        parse_softnet(row.replace("0000001f", "0x1f", 1))
    with pytest.raises(ParseError):
        parse_softnet(row + "\n\n")  # an empty line has no columns


def test_parse_conntrack_stat() -> None:
    head = "entries  clashres found new invalid ...\n"
    line = " ".join(f"{i:08x}" for i in range(17))
    assert parse_conntrack_stat(head + line + "\n" + line + "\n") == [4, 8, 10, 16, 18, 20, 22, 32]
    assert parse_conntrack_stat(head) == [0] * 8
    with pytest.raises(ParseError):
        parse_conntrack_stat(head + line + " 00000000\n")
    with pytest.raises(ParseError):
        parse_conntrack_stat(head + line.replace("00000002", "zz", 1) + "\n")


def test_parse_sockstat() -> None:
    stat = parse_sockstat("sockets: used 12\nTCP: inuse 3 orphan 0 tw 9 alloc 4 mem 0x10\nFRAG: inuse 0 memory 0\n")
    assert stat.used == 12
    assert stat.protocols == [
        ("TCP", {"inuse": 3, "orphan": 0, "tw": 9, "alloc": 4, "mem": 16}),
        ("FRAG", {"inuse": 0, "memory": 0}),
    ]
    for bad in ("TCP: inuse\n", "TCP: inuse 1 tw\n", "TCP: inuse  1\n", "TCP: inuse x\n", "\n"):
        with pytest.raises(ParseError):
            parse_sockstat(bad)


def test_parse_netstat_files() -> None:
    stats = parse_pairs("Tcp: A B\nTcp: 1 -1\nIp: F\nIp: 2\n", "snmp")
    assert stats == {"Tcp": {"A": "1", "B": "-1"}, "Ip": {"F": "2"}}
    with pytest.raises(ParseError):
        parse_pairs("Tcp: A B\nTcp: 1\n", "snmp")
    with pytest.raises(ParseError):
        parse_pairs("Tcp: A B\n", "snmp")  # no value line
    six = parse_snmp6("Ip6InOctets    \t12\nIcmp6OutType133 \t3\nnothing here\nshort\nNoSix 4\n")
    assert six == {"Ip6": {"InOctets": "12"}, "Icmp6": {"OutType133": "3"}}


def test_parse_ib_state_and_rate() -> None:
    assert parse_state("4: ACTIVE\n", "state") == 4
    assert parse_rate("400 Gb/sec (4X NDR)\n", "rate") == 50_000_000_000
    assert parse_rate("2.5 Gb/sec (1X SDR)\n", "rate") == 312_500_000
    assert parse_rate("13.64 Gb/sec\n", "rate") == int(13.640000343322754 * 125_000_000)  # via float32
    for bad in ("ACTIVE\n", "4: A: B\n", "x: ACTIVE\n"):
        with pytest.raises(ParseError):
            parse_state(bad, "state")
    for bad in ("400\n", "fast Gb/sec\n"):
        with pytest.raises(ParseError):
            parse_rate(bad, "rate")


# ----------------------------------------------------------------------------- host roots, ours and node_exporter
GROUP = ["netdev", "netclass", "infiniband", "netstat", "sockstat", "softnet", "conntrack"]


@pytest.fixture
def host(tmp_path: Path) -> Path:
    root = tmp_path / "host"
    shutil.copytree(GPUNODE, root, symlinks=True)
    return root


def success(text: str, collector: str) -> float:
    fam = parse(text)["node_scrape_collector_success"]
    return fam.samples[(("collector", collector),)]


def check(root: Path, collector: str, want_success: float, exact: bool = True, **options: object) -> str:
    """Our verdict for ``collector`` on ``root``; with node_exporter installed, the same as its (and, with
    ``exact``, every family the same)."""
    opts = options_for(root, **options)
    text = ours(root, opts, [collector])
    assert success(text, collector) == want_success
    if binary() is not None:
        their_text = theirs(root, opts, [collector])
        assert success(their_text, collector) == want_success
        if exact:
            assert compare(their_text, text) == []
    return text


def test_gpunode_exports_every_family_of_the_group() -> None:
    text = ours(GPUNODE, options_for(GPUNODE), GROUP)
    names = set(parse(text))
    assert {c: success(text, c) for c in GROUP} == dict.fromkeys(GROUP, 1.0)
    for expected in (
        "node_network_receive_bytes_total",
        "node_network_speed_bytes",
        "node_infiniband_legacy_data_received_bytes_total",
        "node_netstat_Udp6_InDatagrams",
        "node_sockstat_TCP_mem_bytes",
        "node_softnet_times_squeezed_total",
        "node_nf_conntrack_stat_search_restart",
    ):
        assert expected in names
    speeds = parse(text)["node_network_speed_bytes"].samples
    assert speeds[(("device", "eno2"),)] == -125000  # a running link without carrier reads -1 Mb/s
    assert (("device", "lo"),) not in speeds  # EINVAL on the real kernel: the fixture has no file


@pytest.mark.parametrize(
    ("netdev", "want"),
    [
        ({"deviceInclude": "^eno"}, {"eno1", "eno2"}),
        ({"deviceExclude": "^(lo|veth.*)$"}, {"eno1", "eno2", "ib0", "docker0", "cni0"}),
        ({"deviceExclude": "o"}, {"ib0", "cni0", "veth3f2a9c1e"}),  # unanchored
    ],
)
def test_netdev_filters(netdev: dict[str, str], want: set[str]) -> None:
    text = check(GPUNODE, "netdev", 1.0, netdev=netdev)
    assert {dict(k)["device"] for k in parse(text)["node_network_receive_bytes_total"].samples} == want


def test_netdev_include_and_exclude_refused() -> None:
    opts = options_for(GPUNODE, netdev={"deviceInclude": "^eno", "deviceExclude": "^lo$"})
    assert success(ours(GPUNODE, opts, ["netdev"]), "netdev") == 0.0


def test_netdev_malformed_and_missing(host: Path) -> None:
    dev = host / "proc/net/dev"
    dev.write_text(dev.read_text().replace("    lo:", "    lo: x", 1))
    check(host, "netdev", 0.0)
    dev.unlink()
    check(host, "netdev", 0.0)


def test_netclass_tolerates_what_node_exporter_tolerates(host: Path) -> None:
    (host / NET / "mtu").write_text("jumbo\n")  # read as 0
    (host / NET / "speed").unlink()  # as EINVAL on a down device: no speed_bytes
    (host / "sys/class/net/bonding_masters").write_text("\n")  # a regular file is not a device
    text = check(host, "netclass", 1.0)
    assert parse(text)["node_network_mtu_bytes"].samples[(("device", "eno1"),)] == 0


def test_netclass_broken_link_and_missing_class(host: Path) -> None:
    shutil.rmtree(host / NET)
    check(host, "netclass", 0.0)
    shutil.rmtree(host / "sys/class/net")
    check(host, "netclass", 0.0)


def test_infiniband_variants(host: Path) -> None:
    (host / PORT / "counters/symbol_error").write_text("N/A (no PMA)\n")
    shutil.rmtree(host / PORT / "counters_ext")
    (host / PORT / "../../hca_type").unlink()
    text = check(host, "infiniband", 1.0)
    names = set(parse(text))
    assert "node_infiniband_symbol_error_total" not in names
    assert not any(n.startswith("node_infiniband_legacy_") for n in names)


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("counters/link_downed", "many\n"),
        ("state", "ACTIVE\n"),
        ("rate", "400\n"),
        ("phys_state", None),
        ("counters", None),
    ],
)
def test_infiniband_failures(host: Path, path: str, content: str | None) -> None:
    target = host / PORT / path
    if content is None:
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    else:
        target.write_text(content)
    check(host, "infiniband", 0.0)


def test_infiniband_absent(host: Path) -> None:
    shutil.rmtree(host / "sys/class/infiniband")
    check(host, "infiniband", 0.0)


def test_netstat_variants(host: Path) -> None:
    (host / "proc/net/snmp6").unlink()
    check(host, "netstat", 1.0)
    snmp = host / "proc/net/snmp"
    snmp.write_text(snmp.read_text().replace("Udp: 20331874", "Udp: 20331874x", 1))
    # node_exporter sends an arbitrary subset before it meets the bad value: compare the verdict only.
    text = check(host, "netstat", 0.0, exact=False)
    assert not any(n.startswith("node_netstat_") for n in parse(text))
    snmp.unlink()
    check(host, "netstat", 0.0)


@pytest.mark.parametrize(
    ("ttl", "ok"),
    [
        ("64x", 0.0),  # a field that is not served still fails the collector when it does not parse
        ("", 0.0),
        ("-64", 1.0),  # Go floats that are no plain count still parse
        ("0x40p0", 1.0),
        ("1" * 320, 0.0),  # out of a float's range
    ],
)
def test_netstat_checks_every_value(host: Path, ttl: str, ok: float) -> None:
    """Ip's DefaultTTL is not a node_netstat_* series, yet node_exporter parses it, and fails on it."""
    snmp = host / "proc/net/snmp"
    snmp.write_text(snmp.read_text().replace("Ip: 1 64 ", f"Ip: 1 {ttl} ", 1))
    check(host, "netstat", ok, exact=bool(ok))


def test_sockstat_variants(host: Path) -> None:
    (host / "proc/net/sockstat6").unlink()
    check(host, "sockstat", 1.0)
    (host / "proc/net/sockstat").unlink()
    check(host, "sockstat", 1.0)  # neither file: success with nothing
    (host / "proc/net/sockstat").write_text("sockets: used 3\nTCP: inuse 1 orphan\n")
    check(host, "sockstat", 0.0)


def test_softnet_variants(host: Path) -> None:
    stat = host / "proc/net/softnet_stat"
    stat.write_text(stat.read_text() + "00000001 00000000 00000000\n")
    check(host, "softnet", 0.0)
    stat.unlink()
    check(host, "softnet", 0.0)


def test_conntrack_variants(host: Path) -> None:
    (host / "proc/net/stat/nf_conntrack").unlink()
    text = check(host, "conntrack", 0.0)  # count and limit are still exported
    assert "node_nf_conntrack_entries_limit" in parse(text)
    (host / "proc/sys/net/netfilter/nf_conntrack_max").write_text("lots\n")
    check(host, "conntrack", 0.0)
    shutil.rmtree(host / "proc/sys/net/netfilter")
    check(host, "conntrack", 0.0)
