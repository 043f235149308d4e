"""infiniband: ``node_infiniband_*{device,port}`` from ``<sys>/class/infiniband/<hca>/...`` (node_exporter 1.5).

Per HCA: ``board_id``, ``fw_ver`` and ``hca_type`` (optional) -> ``node_infiniband_info``. Per port
(``ports/<n>``): ``state`` / ``phys_state`` (``"4: ACTIVE"``: the number is exported), ``rate`` (``"400 Gb/sec
(4X NDR)"`` -> bytes per second, via a float32 as procfs parses it), and the PMA counters of ``counters/`` plus
the older 64-bit set of ``counters_ext/`` (exported as ``legacy_*``). ``port_{rcv,xmit}_data`` count octets
divided by the 4 lanes, so they are multiplied by 4 into bytes. ``hw_counters/`` is not read by 1.5.

A counter file that does not parse fails the collector, except the ``N/A (no PMA)`` some drivers show; a missing
``class/infiniband`` is no data. Everything is read before anything is exported, as node_exporter does.

``board_id``, ``fw_ver`` and ``hca_type`` are read once per HCA (``static_attrs``): the driver sets the board and
type at registration, and a new firmware only runs after a reset that unregisters the HCA and registers it again
(a new directory, read afresh). A port's state, rate and counters are read every time.
"""

from __future__ import annotations

import math
import operator
import os
import struct
from dataclasses import dataclass, field

from nvdaemon.collectors.base import NotPresent, ParseError, read_attr
from nvdaemon.collectors.static_attrs import StaticAttrs
from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType
from nvdaemon.compat.node_exporter.netclass import read_sysfs_attr
from nvdaemon.compat.node_exporter.sysfs import attr_value
from nvdaemon.goparse import parse_float, parse_uint

_U64 = (1 << 64) - 1
# counters/<file> -> metric (without node_infiniband_); the data counters are per lane (x4).
COUNTERS = {
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors_total",
    "link_downed": "link_downed_total",
    "link_error_recovery": "link_error_recovery_total",
    "local_link_integrity_errors": "local_link_integrity_errors_total",
    "multicast_rcv_packets": "multicast_packets_received_total",
    "multicast_xmit_packets": "multicast_packets_transmitted_total",
    "port_rcv_constraint_errors": "port_constraint_errors_received_total",
    "port_rcv_data": "port_data_received_bytes_total",
    "port_rcv_discards": "port_discards_received_total",
    "port_rcv_errors": "port_errors_received_total",
    "port_rcv_packets": "port_packets_received_total",
    "port_rcv_remote_physical_errors": "port_receive_remote_physical_errors_total",
    "port_rcv_switch_relay_errors": "port_receive_switch_relay_errors_total",
    "port_xmit_constraint_errors": "port_constraint_errors_transmitted_total",
    "port_xmit_data": "port_data_transmitted_bytes_total",
    "port_xmit_discards": "port_discards_transmitted_total",
    "port_xmit_packets": "port_packets_transmitted_total",
    "port_xmit_wait": "port_transmit_wait_total",
    "symbol_error": "symbol_error_total",
    "unicast_rcv_packets": "unicast_packets_received_total",
    "unicast_xmit_packets": "unicast_packets_transmitted_total",
    "VL15_dropped": "vl15_dropped_total",
}
COUNTERS_EXT = {
    "port_multicast_rcv_packets": "legacy_multicast_packets_received_total",
    "port_multicast_xmit_packets": "legacy_multicast_packets_transmitted_total",
    "port_rcv_data_64": "legacy_data_received_bytes_total",
    "port_rcv_packets_64": "legacy_packets_received_total",
    "port_unicast_rcv_packets": "legacy_unicast_packets_received_total",
    "port_unicast_xmit_packets": "legacy_unicast_packets_transmitted_total",
    "port_xmit_data_64": "legacy_data_transmitted_bytes_total",
    "port_xmit_packets_64": "legacy_packets_transmitted_total",
}
HCAS = StaticAttrs()  # board_id, fw_ver, hca_type of each HCA directory
_BY_NAME = operator.attrgetter("name")  # a directory's entries in procfs's (ReadDir's) order
PER_LANE = frozenset({"port_rcv_data", "port_xmit_data", "port_rcv_data_64", "port_xmit_data_64"})
HELP = {
    "legacy_multicast_packets_received_total": "Number of multicast packets received",
    "legacy_multicast_packets_transmitted_total": "Number of multicast packets transmitted",
    "legacy_data_received_bytes_total": "Number of data octets received on all links",
    "legacy_packets_received_total": "Number of data packets received on all links",
    "legacy_unicast_packets_received_total": "Number of unicast packets received",
    "legacy_unicast_packets_transmitted_total": "Number of unicast packets transmitted",
    "legacy_data_transmitted_bytes_total": "Number of data octets transmitted on all links",
    "legacy_packets_transmitted_total": "Number of data packets received on all links",  # sic, as 1.5
    "excessive_buffer_overrun_errors_total": "Number of times that OverrunErrors consecutive flow control update "
    "periods occurred, each having at least one overrun error.",
    "link_downed_total": "Number of times the link failed to recover from an error state and went down",
    "link_error_recovery_total": "Number of times the link successfully recovered from an error state",
    "local_link_integrity_errors_total": "Number of times that the count of local physical errors exceeded the "
    "threshold specified by LocalPhyErrors.",
    "multicast_packets_received_total": "Number of multicast packets received (including errors)",
    "multicast_packets_transmitted_total": "Number of multicast packets transmitted (including errors)",
    "physical_state_id": "Physical state of the InfiniBand port (0: no change, 1: sleep, 2: polling, 3: disable, "
    "4: shift, 5: link up, 6: link error recover, 7: phytest)",
    "port_constraint_errors_received_total": "Number of packets received on the switch physical port that are "
    "discarded",
    "port_constraint_errors_transmitted_total": "Number of packets not transmitted from the switch physical port",
    "port_data_received_bytes_total": "Number of data octets received on all links",
    "port_data_transmitted_bytes_total": "Number of data octets transmitted on all links",
    "port_discards_received_total": "Number of inbound packets discarded by the port because the port is down or "
    "congested",
    "port_discards_transmitted_total": "Number of outbound packets discarded by the port because the port is down "
    "or congested",
    "port_errors_received_total": "Number of packets containing an error that were received on this port",
    "port_packets_received_total": "Number of packets received on all VLs by this port (including errors)",
    "port_packets_transmitted_total": "Number of packets transmitted on all VLs from this port (including errors)",
    "port_transmit_wait_total": "Number of ticks during which the port had data to transmit but no data was sent "
    "during the entire tick",
    "rate_bytes_per_second": "Maximum signal transfer rate",
    "state_id": "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
    "unicast_packets_received_total": "Number of unicast packets received (including errors)",
    "unicast_packets_transmitted_total": "Number of unicast packets transmitted (including errors)",
    "port_receive_remote_physical_errors_total": "Number of packets marked with the EBP (End of Bad Packet) "
    "delimiter received on the port.",
    "port_receive_switch_relay_errors_total": "Number of packets that could not be forwarded by the switch.",
    "symbol_error_total": "Number of minor link errors detected on one or more physical lanes.",
    "vl15_dropped_total": "Number of incoming VL15 packets dropped due to resource limitations.",
}


@dataclass
class Port:
    number: int
    state: int
    phys_state: int
    rate: int  # bytes per second
    counters: dict[str, int] = field(default_factory=dict)  # metric suffix -> value


@dataclass
class Hca:
    name: str
    info: dict[str, str]
    ports: list[Port]


def parse_state(text: str, what: str) -> int:
    """``"4: ACTIVE"`` -> 4 (exactly one colon, a decimal uint32 before it)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise ParseError(f"{what}: expected 'ID: NAME', got {text.strip()[:40]!r}")
    try:
        return parse_uint(parts[0].strip(), bits=32)
    except ValueError as exc:
        raise ParseError(f"{what}: {exc}") from None


def parse_rate(text: str, what: str) -> int:
    """``"400 Gb/sec (4X NDR)"`` -> bytes/s: the number as a float32, times 125000000, to uint64 as Go converts."""
    number, space, _ = text.partition(" ")
    if not space:
        raise ParseError(f"{what}: no unit in {text.strip()[:40]!r}")
    try:
        value = parse_float(number.strip())
        value = struct.unpack("f", struct.pack("f", value))[0]  # ParseFloat(s, 32)
    except (ValueError, OverflowError) as exc:
        raise ParseError(f"{what}: {exc}") from None
    rate = value * 125_000_000
    if math.isnan(rate) or math.isinf(rate):
        return 1 << 63  # amd64's conversion of an unrepresentable float
    return int(rate) & _U64


def read_counters(directory: str, names: dict[str, str], optional: bool) -> dict[str, int]:
    try:
        entries = sorted(os.scandir(directory), key=_BY_NAME)
    except FileNotFoundError:
        if optional:
            return {}
        raise
    counters: dict[str, int] = {}
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue
        value = read_sysfs_attr(entry.path)  # the entry's own path string: no Path built per counter
        metric = names.get(entry.name)
        if value is None or metric is None:
            continue
        try:
            number = parse_uint(value, base=0)
        except ValueError:
            if "N/A (no PMA)" in value:
                continue  # a counter the port's agent does not provide
            raise ParseError(f"{entry.path}: not a counter: {value[:40]!r}") from None
        counters[metric] = (number * 4) & _U64 if entry.name in PER_LANE else number
    return counters


def read_port(hca_dir: str, hca: str, port: str) -> Port:
    """Port ``port`` of the HCA at ``hca_dir`` (``<sys>/class/infiniband/<hca>``); paths are joined as strings."""
    try:
        number = parse_uint(port, bits=32)
    except ValueError:
        raise ParseError(f"infiniband {hca}: bad port directory {port!r}") from None
    base = f"{hca_dir}/ports/{port}"
    # read_attr: the cap NodeContext.read gives a file under the sysfs root.
    state = parse_state(read_attr(f"{base}/state"), f"{base}/state")
    phys_state = parse_state(read_attr(f"{base}/phys_state"), f"{base}/phys_state")
    rate = parse_rate(read_attr(f"{base}/rate"), f"{base}/rate")
    counters = read_counters(f"{base}/counters", COUNTERS, optional=False)
    counters |= read_counters(f"{base}/counters_ext", COUNTERS_EXT, optional=True)
    return Port(number, state, phys_state, rate, counters)


def read_hca(class_dir: str, name: str) -> Hca:
    """The HCA ``name`` under ``class_dir`` (``<sys>/class/infiniband``)."""
    base = os.path.join(class_dir, name)
    try:
        fixed = HCAS.device(base)
    except NotPresent:
        raise ParseError(f"{base}/board_id: missing") from None  # a link left by an HCA that is gone
    info: dict[str, str] = {}
    for attr, label in (("board_id", "board_id"), ("fw_ver", "firmware_version"), ("hca_type", "hca_type")):
        text = fixed.read(attr)
        if text is not None:
            info[label] = attr_value(text)
        elif attr != "hca_type":  # not every driver has hca_type
            raise ParseError(f"{base}/{attr}: missing")
    ports = {}
    for port in sorted(os.listdir(f"{base}/ports")):
        parsed = read_port(base, name, port)
        ports[parsed.number] = parsed  # keyed by number, as procfs's map
    return Hca(name, info, list(ports.values()))


def collect(ctx: NodeContext, out: list[Family]) -> None:
    root = os.fspath(ctx.sys("class", "infiniband"))
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError as exc:
        raise NoData(root) from exc
    hcas = [read_hca(root, name) for name in names]
    info = Family("node_infiniband_info", "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.")
    families: dict[str, Family] = {}

    def family(metric: str, kind: FamilyType) -> Family:
        if metric not in families:
            families[metric] = Family(f"node_infiniband_{metric}", HELP[metric], kind)
        return families[metric]

    for hca in hcas:
        info.add(1.0, {"board_id": "", "firmware_version": "", "hca_type": "", **hca.info}, device=hca.name)
        for port in hca.ports:
            labels = {"device": hca.name, "port": str(port.number)}
            family("state_id", "gauge").add(port.state, labels)
            family("physical_state_id", "gauge").add(port.phys_state, labels)
            family("rate_bytes_per_second", "gauge").add(port.rate, labels)
            for metric, value in port.counters.items():
                family(metric, "counter").add(value, labels)
    out.append(info)
    out.extend(families.values())
