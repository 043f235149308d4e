"""Per-interface traffic counters from ``<proc>/net/dev``.

Two header lines, then ``  eth0: <8 receive fields> <8 transmit fields>``: bytes packets errs drop fifo frame
compressed multicast | bytes packets errs drop fifo colls carrier compressed. All are counters since the
interface was created. Large values can run into the colon (``eth0:123...``), so split on the colon, not on
whitespace. ``lo`` is skipped: its traffic says nothing about the hardware.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvdaemon.collectors.base import (
    Collector,
    Gathered,
    HostRoots,
    Interpreted,
    ParseError,
    all_uints,
    interpreted,
    read_table,
)
from nvdaemon.collectors.bounds import ENTRIES_MAX, FIELDS_MAX, LABEL_MAX, Problems, too_many
from nvdaemon.model import Kind, Sample

_FIELDS = 16
# Field index -> metric.
_METRICS = {
    0: "net_rx_bytes_total",
    1: "net_rx_packets_total",
    2: "net_rx_errors_total",
    3: "net_rx_dropped_total",
    8: "net_tx_bytes_total",
    9: "net_tx_packets_total",
    10: "net_tx_errors_total",
    11: "net_tx_dropped_total",
}
_SKIP = frozenset({"lo"})


@dataclass
class NetDev:
    interfaces: dict[str, tuple[int, ...]] = field(default_factory=dict)  # every interface, lo included
    errors: Problems = field(default_factory=Problems)


def read_netdev(roots: HostRoots) -> str:
    return read_table(roots.proc / "net" / "dev")


def parse_netdev(text: str) -> NetDev:
    """Parse /proc/net/dev. A malformed interface line goes to ``errors``; no interface at all raises."""
    result = NetDev()
    for line in text.splitlines():
        if not line.strip() or "|" in line:  # blank or one of the two header lines
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or not name or " " in name or len(name) > LABEL_MAX:
            result.errors.append(f"/proc/net/dev: malformed line {line[:60]!r}")
            continue
        if len(result.interfaces) >= ENTRIES_MAX and name not in result.interfaces:
            result.errors.append(too_many("/proc/net/dev"))
            break
        values = rest.split(None, FIELDS_MAX)  # a real line has 16 values; a longer one is not split whole
        if len(values) < _FIELDS or len(values) > FIELDS_MAX or not all_uints(values[:_FIELDS]):
            result.errors.append(f"/proc/net/dev: {name}: expected {_FIELDS} counters, got {rest.strip()[:60]!r}")
            continue
        result.interfaces[name] = tuple(map(int, values[:_FIELDS]))
    if not result.interfaces:
        raise ParseError("/proc/net/dev: no interfaces" + (f" ({result.errors[0]})" if result.errors else ""))
    return result


class NetDevCollector(Collector):
    name = "netdev"
    tier = "core"
    may_hang = False  # one /proc file, answered from kernel memory

    def gather(self, roots: HostRoots) -> Gathered:
        parsed = parse_netdev(read_netdev(roots))
        return Gathered(parsed, errors=parsed.errors.summary())

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        data: NetDev = gathered.data
        return interpreted(
            Sample(metric=metric, device=iface, value=float(values[i]), kind=Kind.COUNTER, tier="core", timestamp=now)
            for iface, values in data.interfaces.items()
            if iface not in _SKIP
            for i, metric in _METRICS.items()
        )
