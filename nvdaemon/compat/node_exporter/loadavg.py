"""loadavg: ``node_load1``, ``node_load5``, ``node_load15`` from ``<proc>/loadavg`` (no unit).

Parsing is shared with the hardware surface's loadavg collector, and so is the read (one per cycle).
"""

from __future__ import annotations

from nvdaemon.collectors.loadavg import parse_loadavg
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge


def collect(ctx: NodeContext, out: list[Family]) -> None:
    data = parse_loadavg(ctx.read(ctx.proc("loadavg")))
    out.append(gauge("node_load1", "1m load average.", data.load1))
    out.append(gauge("node_load5", "5m load average.", data.load5))
    out.append(gauge("node_load15", "15m load average.", data.load15))
