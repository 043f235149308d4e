"""softnet: ``node_softnet_{processed,dropped,times_squeezed}_total{cpu}`` from ``<proc>/net/softnet_stat``.

One line per online CPU of hexadecimal 32-bit columns (``%08x``): packets processed, packets dropped (backlog
full), times net_rx_action ran out of budget, then more columns that node_exporter 1.5 does not export. Its ``cpu``
label is the line's position, not the CPU-id column newer kernels append. A line with fewer than 9 columns or a
first three columns that are not hex uint32 fails the collector with nothing exported; so does a missing file.
"""

from __future__ import annotations

from nvdaemon.collectors.base import ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.goparse import parse_uint, scan_lines

MIN_COLUMNS = 9


def parse_softnet(text: str) -> list[tuple[int, int, int]]:
    """(processed, dropped, time_squeeze) per line."""
    rows: list[tuple[int, int, int]] = []
    for n, line in enumerate(scan_lines(text)):
        columns = line.split()
        if len(columns) < MIN_COLUMNS:
            raise ParseError(f"/proc/net/softnet_stat: line {n + 1}: {len(columns)} columns, at least 9 expected")
        try:
            processed, dropped, squeezed = (parse_uint(c, base=16, bits=32) for c in columns[:3])
        except ValueError as exc:
            raise ParseError(f"/proc/net/softnet_stat: line {n + 1}: {exc}") from None
        rows.append((processed, dropped, squeezed))
    return rows


def collect(ctx: NodeContext, out: list[Family]) -> None:
    rows = parse_softnet(ctx.read(ctx.proc("net", "softnet_stat")))
    processed = Family("node_softnet_processed_total", "Number of processed packets", "counter")
    dropped = Family("node_softnet_dropped_total", "Number of dropped packets", "counter")
    squeezed = Family(
        "node_softnet_times_squeezed_total", "Number of times processing packets ran out of quota", "counter"
    )
    for cpu, (p, d, s) in enumerate(rows):
        processed.add(p, cpu=str(cpu))
        dropped.add(d, cpu=str(cpu))
        squeezed.add(s, cpu=str(cpu))
    out.extend([processed, dropped, squeezed])
