"""netdev: ``node_network_<stat>_total{device}`` from ``<proc>/net/dev`` (bytes, packets, events; counters).

node_exporter 1.5 as run here (``--no-collector.netdev.netlink``, no address info, no detailed metrics) reads the
16 columns of ``/proc/net/dev`` and names them with the kernel's legacy keys (``receive_errs``, ``transmit_colls``
...). The device filter is ``nodeExporter.netdev.deviceInclude`` / ``deviceExclude`` (node_exporter's
``--collector.netdev.device-include`` / ``-exclude``: unanchored regexps, mutually exclusive).
"""

from __future__ import annotations

from nvdaemon.collectors.base import ParseError
from nvdaemon.collectors.bounds import LABEL_MAX
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import LABEL_SETS, SAMPLES_MAX, Family
from nvdaemon.compat.node_exporter.options import compile_filter, filtered_out
from nvdaemon.goparse import parse_uint, scan_lines

# The 16 columns of /proc/net/dev under the names node_exporter gives them after its legacy() renaming.
KEYS = (
    "receive_bytes",
    "receive_packets",
    "receive_errs",
    "receive_drop",
    "receive_fifo",
    "receive_frame",
    "receive_compressed",
    "receive_multicast",
    "transmit_bytes",
    "transmit_packets",
    "transmit_errs",
    "transmit_drop",
    "transmit_fifo",
    "transmit_colls",
    "transmit_carrier",
    "transmit_compressed",
)


def parse_proc_net_dev(text: str) -> dict[str, tuple[int, ...]]:
    """Device -> its 16 counters. As procfs: the first two lines are headers whatever they hold, the name is what
    precedes the last colon, and any malformed line fails the whole file."""
    devices: dict[str, tuple[int, ...]] = {}
    for n, line in enumerate(scan_lines(text)):
        if n < 2:
            continue
        name, colon, rest = line.rpartition(":")
        if not colon:
            raise ParseError(f"/proc/net/dev: line {n + 1}: missing colon: {line[:60]!r}")
        name = name.strip()
        if not name:
            raise ParseError(f"/proc/net/dev: line {n + 1}: empty interface name")
        fields = rest.split()
        if len(fields) < len(KEYS):
            # node_exporter indexes past the end here and crashes; failing the collector is the sane equivalent.
            raise ParseError(f"/proc/net/dev: {name}: {len(fields)} fields, expected {len(KEYS)}")
        counters = fields[: len(KEYS)]
        digits = "".join(counters)
        if digits.isascii() and digits.isdigit() and max(map(len, counters)) <= 18:
            # What ParseUint answers for decimal digits that cannot pass 2**64, without a call per counter
            # (the 112 parse_uint calls of a 7-interface host were a third of this collector's CPU).
            devices[name] = tuple(map(int, counters))
            continue
        try:
            devices[name] = tuple(parse_uint(v) for v in counters)
        except ValueError as exc:
            raise ParseError(f"/proc/net/dev: {name}: {exc}") from None
    return devices


def add_device_rows(families: list[Family], rows: list[tuple[str, tuple[int, ...]]]) -> None:
    """``families[i].add(values[i], device=name)`` for each row, with ``Family.add``'s checks (sample count, label
    length) done once per row: one ``add`` per counter was a third of this collector's CPU."""
    if len(rows) > SAMPLES_MAX:
        raise ParseError(f"{families[0].name}: more than {SAMPLES_MAX} samples")
    for name, values in rows:
        if len(name) > LABEL_MAX:
            raise ParseError(f"{families[0].name}: label device of {len(name)} characters, over {LABEL_MAX}")
        labels = LABEL_SETS.canonical((("device", name),))  # the tuple an earlier cycle made
        for fam, value in zip(families, values, strict=True):
            fam.samples.append((labels, float(value)))


def collect(ctx: NodeContext, out: list[Family]) -> None:
    options = ctx.options.netdev
    if options.device_include and options.device_exclude:
        raise ValueError("netdev: deviceInclude and deviceExclude are mutually exclusive")
    include = compile_filter(options.device_include)
    exclude = compile_filter(options.device_exclude)
    devices = parse_proc_net_dev(ctx.read(ctx.proc("net", "dev")))
    families = [Family(f"node_network_{key}_total", f"Network device statistic {key}.", "counter") for key in KEYS]
    add_device_rows(families, [row for row in devices.items() if not filtered_out(row[0], include, exclude)])
    out.extend(families)
