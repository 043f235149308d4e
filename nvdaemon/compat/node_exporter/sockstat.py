"""sockstat: ``node_sockstat_*`` from ``<proc>/net/sockstat`` and ``<proc>/net/sockstat6`` (counts; ``mem`` pages).

Each line is ``PROTO: key value key value ...``: ``sockets: used N`` gives ``node_sockstat_sockets_used`` (IPv4
only), every other line ``node_sockstat_<PROTO>_<key>`` for the keys node_exporter knows (inuse, orphan, tw,
alloc, mem, memory; ``inuse`` always, 0 when absent). ``mem`` is in pages, so ``<PROTO>_mem_bytes`` is it times
this machine's page size (node_exporter uses its own page size too). A missing file is skipped (IPv6 or IPv4
disabled): with neither the collector succeeds with nothing. A malformed line fails it with nothing exported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nvdaemon.collectors.base import NotPresent, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.goparse import parse_int, scan_lines, wrap_int64

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
_KEYS = ("inuse", "orphan", "tw", "alloc", "mem", "memory")  # export order; only these keys are exported


@dataclass
class Sockstat:
    used: int | None = None  # the "sockets: used" line
    protocols: list[tuple[str, dict[str, int]]] = field(default_factory=list)


def parse_sockstat(text: str, source: str = "sockstat") -> Sockstat:
    stat = Sockstat()
    for line in scan_lines(text):
        fields = line.split(" ")  # single spaces, as procfs splits; a doubled space is an empty (bad) value
        if len(fields) < 3:
            raise ParseError(f"{source}: malformed line {line[:60]!r}")
        pairs = fields[1:]
        if len(pairs) % 2:
            raise ParseError(f"{source}: odd number of fields in {line[:60]!r}")
        values: dict[str, int] = {}
        for key, raw in zip(pairs[::2], pairs[1::2], strict=True):
            try:
                values[key] = parse_int(raw, base=0)
            except ValueError as exc:
                raise ParseError(f"{source}: {line[:60]!r}: {exc}") from None
        proto = fields[0].removesuffix(":")
        if proto == "sockets":
            stat.used = values.get("used", 0)
        else:
            stat.protocols.append((proto, values))
    return stat


def _read(ctx: NodeContext, name: str) -> Sockstat | None:
    try:
        text = ctx.read(ctx.proc("net", name))
    except NotPresent:
        return None
    return parse_sockstat(text, f"/proc/net/{name}")


def _export(out: list[Family], stat: Sockstat, ipv6: bool) -> None:
    if not ipv6 and stat.used is not None:
        out.append(gauge("node_sockstat_sockets_used", "Number of IPv4 sockets in use.", stat.used))
    for proto, values in stat.protocols:
        exported = {"inuse": values.get("inuse", 0)} | {k: values[k] for k in _KEYS[1:] if k in values}
        if "mem" in values:
            exported["mem_bytes"] = wrap_int64(values["mem"] * PAGE_SIZE)
        for key, value in exported.items():
            name = f"node_sockstat_{proto}_{key}"
            out.append(gauge(name, f"Number of {proto} sockets in state {key}.", value))


def collect(ctx: NodeContext, out: list[Family]) -> None:
    stat4 = _read(ctx, "sockstat")
    stat6 = _read(ctx, "sockstat6")
    if stat4 is not None:
        _export(out, stat4, ipv6=False)
    if stat6 is not None:
        _export(out, stat6, ipv6=True)
