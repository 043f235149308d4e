"""entropy: ``node_entropy_available_bits`` and ``node_entropy_pool_size_bits`` from ``<proc>/sys/kernel/random``.

node_exporter reads every integer file of the directory it knows (``entropy_avail``, ``poolsize``,
``urandom_min_reseed_secs``, ``write_wakeup_threshold``, ``read_wakeup_threshold``; newer kernels lack some):
an absent file is skipped, but one that cannot be read or is not an unsigned integer fails the collector. Without
``entropy_avail`` (or ``poolsize``) the collector fails too; values are bits.
"""

from __future__ import annotations

from nvdaemon.collectors.base import NotPresent, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.compat.node_exporter.sysfs import read_int_file

FILES = ("entropy_avail", "poolsize", "urandom_min_reseed_secs", "write_wakeup_threshold", "read_wakeup_threshold")


def read_random(ctx: NodeContext) -> dict[str, int]:
    """The files present, parsed; an unreadable or malformed one raises."""
    values: dict[str, int] = {}
    for name in FILES:
        try:
            values[name] = read_int_file(ctx, ctx.proc("sys", "kernel", "random", name))
        except NotPresent:
            continue
    return values


def collect(ctx: NodeContext, out: list[Family]) -> None:
    values = read_random(ctx)
    # Not ErrNoData in node_exporter: a missing file here is an error there, and it is logged as one.
    if "entropy_avail" not in values:
        raise ParseError("couldn't get entropy_avail")
    out.append(gauge("node_entropy_available_bits", "Bits of available entropy.", values["entropy_avail"]))
    if "poolsize" not in values:
        raise ParseError("couldn't get entropy poolsize")
    out.append(gauge("node_entropy_pool_size_bits", "Bits of entropy pool.", values["poolsize"]))
