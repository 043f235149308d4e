"""netdev: ``node_network_<stat>_total{device}`` from ``<proc>/net/dev`` (bytes, packets, events; counters).

node_exporter 1.5 as run here (``--no-collector.netdev.netlink``, no address info, no detailed metrics) reads the
16 columns of ``/proc/net/dev`` and names them with the kernel's legacy keys (``receive_errs``, ``transmit_colls``
...). The device filter is ``nodeExporter.netdev.deviceInclude`` / ``deviceExclude`` (node_exporter's
``--collector.netdev.device-include`` / ``-exclude``: unanchored regexps, mutually exclusive).

This module also holds the small Go-compatible parsing helpers the other net collectors share: node_exporter's
parsers are strict in ways Python's ``int``/``float`` are not (no whitespace, no Unicode digits, ``0x``/octal
prefixes only in base 0), and matching them is what makes the success/failure verdicts agree.
"""

from __future__ import annotations

import math
import re

from nvdaemon.collectors.base import ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.compat.node_exporter.options import compile_filter

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

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_DECIMAL_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_HEX_FLOAT = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+", re.ASCII)
_SPECIAL_FLOAT = re.compile(r"[+-]?(?:inf|infinity)|nan", re.ASCII | re.IGNORECASE)


def go_lines(text: str) -> list[str]:
    """The lines ``bufio.Scanner`` yields: split on ``\\n`` only, a final ``\\r`` dropped, no empty tail."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def go_parse_int(text: str, base: int = 10, bits: int = 64, signed: bool = False) -> int:
    """``strconv.ParseUint`` (``signed=False``) or ``ParseInt``; base 0 infers 0x/0o/0b/leading-0 prefixes."""
    body = text
    negative = False
    if signed and body[:1] in ("+", "-"):
        negative = body[0] == "-"
        body = body[1:]
    underscores_ok = base == 0
    prefixed = False
    if base == 0:
        base = 10
        if body[:1] == "0" and len(body) > 1:
            kind = body[1].lower()
            if kind in "xob":
                base = {"x": 16, "o": 8, "b": 2}[kind]
                body = body[2:]
                prefixed = True
            else:
                base = 8  # a leading 0 means octal; the 0 stays as a digit
    if "_" in body:
        # Go allows underscores only between digits (or right after a base prefix), and only in base 0.
        if not underscores_ok or body.endswith("_") or "__" in body or (body.startswith("_") and not prefixed):
            raise ValueError(f"invalid syntax: {text!r}")
        body = body.replace("_", "")
    allowed = _DIGITS[:base]
    if not body or any(c not in allowed for c in body.lower()):
        raise ValueError(f"invalid syntax: {text!r}")
    value = -int(body, base) if negative else int(body, base)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise ValueError(f"value out of range: {text!r}")
    return value


def go_parse_float(text: str) -> float:
    """``strconv.ParseFloat(s, 64)``: decimal, hex (``0x1p3``), inf/infinity/nan; overflow is an error."""
    if _SPECIAL_FLOAT.fullmatch(text):
        return float(text)
    if _HEX_FLOAT.fullmatch(text):
        value = float.fromhex(text)
    elif _DECIMAL_FLOAT.fullmatch(text):
        value = float(text)
    else:
        raise ValueError(f"invalid syntax: {text!r}")
    if math.isinf(value):
        raise ValueError(f"value out of range: {text!r}")
    return value


def parse_proc_net_dev(text: str) -> dict[str, tuple[int, ...]]:
    """Device -> its 16 counters. As procfs: the first two lines are headers whatever they hold, the name is what
    precedes the last colon, and any malformed line fails the whole file."""
    devices: dict[str, tuple[int, ...]] = {}
    for n, line in enumerate(go_lines(text)):
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
        try:
            devices[name] = tuple(go_parse_int(v) for v in fields[: len(KEYS)])
        except ValueError as exc:
            raise ParseError(f"/proc/net/dev: {name}: {exc}") from None
    return devices


def collect(ctx: NodeContext, out: list[Family]) -> None:
    options = ctx.options.netdev
    if options.device_include and options.device_exclude:
        raise ValueError("netdev: deviceInclude and deviceExclude are mutually exclusive")
    include = compile_filter(options.device_include)
    exclude = compile_filter(options.device_exclude)
    devices = parse_proc_net_dev(ctx.read(ctx.proc("net", "dev")))
    families = [Family(f"node_network_{key}_total", f"Network device statistic {key}.", "counter") for key in KEYS]
    for name, values in devices.items():
        if (exclude is not None and exclude.search(name)) or (include is not None and not include.search(name)):
            continue
        for fam, value in zip(families, values, strict=True):
            fam.add(value, device=name)
    out.extend(families)
