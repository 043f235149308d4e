"""vmstat: ``node_vmstat_<field>`` (untyped) from ``<proc>/vmstat``, for the fields node_exporter selects.

Each line is ``name value`` (counts of pages or events since boot, exported unchanged). node_exporter's default
field filter ``^(oom_kill|pgpg|pswp|pg.*fault).*`` applies (its ``--collector.vmstat.fields`` has no config key
here). node_exporter streams the fields in file order and stops at the first bad value, keeping what it already
sent; so do we.
"""

from __future__ import annotations

import re

from nvdaemon.collectors.base import ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.compat.node_exporter.meminfo import metric_name
from nvdaemon.goparse import parse_float

FIELDS = re.compile(r"^(oom_kill|pgpg|pswp|pg.*fault).*", re.ASCII)


def collect(ctx: NodeContext, out: list[Family]) -> None:
    text = ctx.read(ctx.proc("vmstat"))
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2:  # node_exporter would panic on such a line; a failed collector is kinder
            raise ParseError(f"vmstat: malformed line {line[:80]!r}")
        try:
            value = parse_float(parts[1])
        except ValueError as exc:
            raise ParseError(f"vmstat: invalid value in {line[:80]!r}: {exc}") from None
        if not FIELDS.search(parts[0]):
            continue
        name = metric_name(f"node_vmstat_{parts[0]}")
        out.append(Family(name, f"/proc/vmstat information field {parts[0]}.", "untyped").add(value))
