"""pressure: cumulative stall time from ``<proc>/pressure/{cpu,io,memory}`` (microseconds, served as seconds).

Families: ``node_pressure_cpu_waiting_seconds_total`` (cpu ``some``), ``node_pressure_io_waiting_seconds_total``
and ``node_pressure_io_stalled_seconds_total`` (io ``some``/``full``), and the same pair for memory. The avg10/60/300
percentages are parsed but not served; ``irq`` (Linux 6.1+) is not read by node_exporter 1.5.

Outcomes follow node_exporter 1.5: resources are read in the order cpu, io, memory, and each family is sent as soon
as its file is parsed. A missing file (no CONFIG_PSI, or an old kernel) or EOPNOTSUPP (booted with psi=0) ends the
collector as ``ErrNoData`` after what was sent; a malformed ``some``/``full`` line fails it. Lines of another kind
are ignored. A file lacking the line a family needs (io or memory without ``full``) crashes node_exporter; here it
fails the collector.
"""

from __future__ import annotations

import errno

from nvdaemon.collectors.base import ParseError
from nvdaemon.collectors.pressure import PsiLine  # the same four values the hardware surface parses
from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.family import Family, counter
from nvdaemon.compat.node_exporter.procstat import sscanf
from nvdaemon.goparse import MAX_LINE

RESOURCES = ("cpu", "io", "memory")
_LINE_FORMAT = "avg10=%f avg60=%f avg300=%f total=%d"

# resource -> ((line kind, family, HELP), ...)
FAMILIES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "cpu": (
        (
            "some",
            "node_pressure_cpu_waiting_seconds_total",
            "Total time in seconds that processes have waited for CPU time",
        ),
    ),
    "io": (
        (
            "some",
            "node_pressure_io_waiting_seconds_total",
            "Total time in seconds that processes have waited due to IO congestion",
        ),
        (
            "full",
            "node_pressure_io_stalled_seconds_total",
            "Total time in seconds no process could make progress due to IO congestion",
        ),
    ),
    "memory": (
        (
            "some",
            "node_pressure_memory_waiting_seconds_total",
            "Total time in seconds that processes have waited for memory",
        ),
        (
            "full",
            "node_pressure_memory_stalled_seconds_total",
            "Total time in seconds no process could make progress due to memory congestion",
        ),
    ),
}


def parse_psi(text: str, resource: str = "?") -> dict[str, PsiLine]:
    """``{"some": ..., "full": ...}`` with the lines present; the last of a kind wins, as in procfs."""
    lines: dict[str, PsiLine] = {}
    for line in text.split("\n"):
        if len(line.encode()) >= MAX_LINE:
            break  # bufio.Scanner gives up there and procfs does not check its error: the rest is ignored
        kind = line.split(" ")[0]  # only a single space separates the kind (procfs splits on " ")
        if kind not in ("some", "full"):
            continue
        try:
            values = sscanf(line, f"{kind} {_LINE_FORMAT}")
        except ValueError as exc:
            raise ParseError(f"/proc/pressure/{resource}: {line[:80]!r}: {exc}") from None
        avg10, avg60, avg300, total = values
        assert isinstance(avg10, float) and isinstance(avg60, float) and isinstance(avg300, float)
        assert isinstance(total, int)
        lines[kind] = PsiLine(avg10, avg60, avg300, total)
    return lines


def collect(ctx: NodeContext, out: list[Family]) -> None:
    for resource in RESOURCES:
        try:
            text = ctx.read(ctx.proc("pressure", resource))
        except OSError as exc:
            if exc.errno == errno.EOPNOTSUPP:  # PSI compiled in but disabled (psi=0)
                raise NoData(f"pressure information is disabled: {exc}") from exc
            raise
        lines = parse_psi(text, resource)
        for kind, name, help_ in FAMILIES[resource]:
            psi = lines.get(kind)
            if psi is None:
                raise ParseError(f"/proc/pressure/{resource}: no {kind!r} line")
            # two divisions, not one by 1e6: node_exporter's float rounding, to the last bit
            out.append(counter(name, help_, psi.total_us / 1000.0 / 1000.0))
