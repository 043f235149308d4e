"""meminfo: ``node_memory_<Field>[_bytes]`` from ``<proc>/meminfo``, one family per line of the file.

Lines are ``Name:   value kB`` (kibibytes, exported in bytes with a ``_bytes`` suffix) or ``Name:  value`` (a
plain count such as ``HugePages_Total``, exported as is). A field in parentheses becomes a suffix:
``Active(anon)`` -> ``node_memory_Active_anon_bytes``. Fields ending in ``_total`` are counters, the rest gauges.
Any malformed line fails the whole collector with nothing exported, as node_exporter does.
"""

from __future__ import annotations

import re

from nvdaemon.collectors.base import ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType
from nvdaemon.goparse import parse_float

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.ASCII)
_PARENS = re.compile(r"\((.*)\)")  # greedy, as node_exporter's: "Active(anon)" -> "Active_anon"


def metric_name(name: str) -> str:
    """``name`` if it is a valid metric name; node_exporter panics on an invalid one, we fail the collector."""
    if not _METRIC_NAME.fullmatch(name):
        raise ParseError(f"{name!r} is not a valid metric name")
    return name


def parse_meminfo(text: str) -> dict[str, float]:
    """Field name as node_exporter mangles it (with ``_bytes`` for kB lines) -> value; ParseError on bad input."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:  # blank lines occur on some old kernels
            continue
        if len(parts) < 2:
            raise ParseError(f"meminfo: line without a value: {line[:80]!r}")
        try:
            value = parse_float(parts[1])
        except ParseError as exc:
            raise ParseError(f"meminfo: invalid value in {line[:80]!r}: {exc}") from None
        key = _PARENS.sub(r"_\1", parts[0][:-1])  # drop the ':' (node_exporter drops the last byte, whatever it is)
        if len(parts) == 3:  # a unit: always kB
            value *= 1024
            key += "_bytes"
        elif len(parts) != 2:
            raise ParseError(f"meminfo: invalid line {line[:80]!r}")
        values[key] = value  # a repeated field: the last one wins
    return values


def collect(ctx: NodeContext, out: list[Family]) -> None:
    values = parse_meminfo(ctx.read(ctx.proc("meminfo")))
    names = {key: metric_name(f"node_memory_{key}") for key in values}  # all checked before any is sent
    for key, value in values.items():
        name = names[key]
        kind: FamilyType = "counter" if key.endswith("_total") else "gauge"
        out.append(Family(name, f"Memory information field {key}.", kind).add(value))
