from __future__ import annotations

from nvdaemon.collectors.base import HostRoots
from nvdaemon.collectors.netdev import NetDevCollector, parse_netdev
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, collect, value

METRICS = {
    "net_rx_bytes_total",
    "net_tx_bytes_total",
    "net_rx_packets_total",
    "net_tx_packets_total",
    "net_rx_errors_total",
    "net_tx_errors_total",
    "net_rx_dropped_total",
    "net_tx_dropped_total",
}


def test_healthy() -> None:
    gathered, samples = collect(NetDevCollector(), HEALTHY)
    assert gathered.errors == []
    assert {s.device for s in samples} == {"eth0", "ib0"}  # lo skipped
    assert {s.metric for s in samples} == METRICS
    assert all(s.kind is Kind.COUNTER for s in samples)
    assert value(samples, "net_rx_bytes_total", "eth0") == 987654321012
    assert value(samples, "net_rx_packets_total", "eth0") == 712345678
    assert value(samples, "net_rx_dropped_total", "eth0") == 12
    assert value(samples, "net_tx_bytes_total", "eth0") == 123456789012
    assert value(samples, "net_tx_packets_total", "eth0") == 345678901
    assert value(samples, "net_tx_bytes_total", "ib0") == 4321098765432


def test_faulty_has_errors() -> None:
    _, samples = collect(NetDevCollector(), FAULTY)
    assert value(samples, "net_rx_errors_total", "eth0") == 4821
    assert value(samples, "net_rx_dropped_total", "eth0") == 1532
    assert value(samples, "net_tx_errors_total", "eth0") == 17
    assert value(samples, "net_tx_dropped_total", "eth0") == 0


def test_malformed_line_keeps_other_interfaces(healthy_copy: HostRoots) -> None:
    path = healthy_copy.proc / "net" / "dev"
    lines = path.read_text().splitlines()
    lines = [ln.replace("712345678", "7x2345678") if "eth0:" in ln else ln for ln in lines]
    path.write_text("\n".join(lines) + "\n")
    gathered, samples = collect(NetDevCollector(), healthy_copy)
    assert len(gathered.errors) == 1
    assert "/proc/net/dev" in gathered.errors[0] and "eth0" in gathered.errors[0]
    assert {s.device for s in samples} == {"ib0"}
    assert value(samples, "net_rx_bytes_total", "ib0") == 5432109876543


def test_counter_touching_the_colon() -> None:
    parsed = parse_netdev("  eth1:12345678901 2 0 0 0 0 0 0 3 4 0 0 0 0 0 0\n")
    assert parsed.interfaces["eth1"][0] == 12345678901
    assert parsed.interfaces["eth1"][8] == 3
