"""netstat: ``node_netstat_<Proto>_<Field>`` (untyped) from ``<proc>/net/{netstat,snmp,snmp6}``.

``netstat`` and ``snmp`` come in line pairs, ``Proto: Name Name ...`` then ``Proto: value value ...``; ``snmp6``
has one ``Ip6InReceives  <tab> value`` per line, the protocol being the name up to its first ``6``. Protocols of
``snmp`` then ``snmp6`` replace same-named ones read before. Only fields whose ``<Proto>_<Field>`` matches
node_exporter's default ``--collector.netstat.fields`` are exported; counts, octets and the ``Ip_Forwarding``
flag, no unit conversion. ``snmp6`` may be absent (IPv6 disabled); the others may not.

Every value must parse as a float, exported or not. node_exporter streams samples in Go's random map order and
stops at the first bad value, so what it sent before the error is arbitrary; we check all values first and export
nothing on a bad one (same success verdict, no arbitrary partial set).
"""

from __future__ import annotations

import contextlib
import re

from nvdaemon.collectors.base import NotPresent, ParseError, all_uints
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, untyped
from nvdaemon.goparse import parse_float, scan_lines

FIELDS = re.compile(
    r"^(.*_(InErrors|InErrs)|Ip_Forwarding|Ip(6|Ext)_(InOctets|OutOctets)|Icmp6?_(InMsgs|OutMsgs)"
    r"|TcpExt_(Listen.*|Syncookies.*|TCPSynRetrans|TCPTimeouts)"
    r"|Tcp_(ActiveOpens|InSegs|OutSegs|OutRsts|PassiveOpens|RetransSegs|CurrEstab)"
    r"|Udp6?_(InDatagrams|OutDatagrams|NoPorts|RcvbufErrors|SndbufErrors))$"
)

Stats = dict[str, dict[str, str]]  # protocol -> field -> value text


def parse_pairs(text: str, source: str) -> Stats:
    """``netstat``/``snmp``: a header line and a value line per protocol, single-space separated."""
    stats: Stats = {}
    lines = scan_lines(text)
    for i in range(0, len(lines), 2):
        names = lines[i].split(" ")
        values = (lines[i + 1] if i + 1 < len(lines) else "").split(" ")
        if not names[0]:
            raise ParseError(f"{source}: line {i + 1}: no protocol name")
        protocol = names[0][:-1]  # the trailing colon
        if len(names) != len(values):
            raise ParseError(f"{source}: {protocol}: {len(names)} names but {len(values)} values")
        stats[protocol] = dict(zip(names[1:], values[1:], strict=True))
    return stats


def parse_snmp6(text: str) -> Stats:
    """``snmp6``: ``Ip6InReceives <value>`` lines; a name without a ``6`` or a short line is skipped."""
    stats: Stats = {}
    for line in scan_lines(text):
        fields = line.split()
        if len(fields) < 2:
            continue
        six = fields[0].find("6")
        if six != -1:
            stats.setdefault(fields[0][: six + 1], {})[fields[0][six + 1 :]] = fields[1]
    return stats


def collect(ctx: NodeContext, out: list[Family]) -> None:
    stats = parse_pairs(ctx.read(ctx.proc("net", "netstat")), "/proc/net/netstat")
    stats.update(parse_pairs(ctx.read(ctx.proc("net", "snmp")), "/proc/net/snmp"))
    with contextlib.suppress(NotPresent):  # absent with IPv6 disabled
        stats.update(parse_snmp6(ctx.read(ctx.proc("net", "snmp6"))))
    families: list[Family] = []
    for protocol, fields in stats.items():
        texts = list(fields.values())
        # Every value must parse, as node_exporter fails on any (parse_float per value was two thirds of this
        # collector's CPU: a host has some 400 fields, of which some 30 are served). Plain unsigned counts, all
        # of them but Tcp's MaxConn -1, are checked at once (float() of one is Go's value; a value split(" ") left
        # empty is not one); then only the selected fields are converted.
        if not (all(texts) and all_uints(texts)):
            for name, text in fields.items():
                try:
                    parse_float(text)
                except ValueError:
                    raise ParseError(f"netstat: invalid value {text!r} for {protocol}{name}") from None
        for name in _selected(protocol, tuple(fields)):
            key = f"{protocol}_{name}"
            value = parse_float(fields[name])
            families.append(untyped(f"node_netstat_{key}", f"Statistic {protocol}{name}.", value))
    out.extend(families)


# (protocol, its field names in file order) -> the names FIELDS selects: the same few lines every cycle.
_SELECTED: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {}


def _selected(protocol: str, names: tuple[str, ...]) -> tuple[str, ...]:
    hit = _SELECTED.get((protocol, names))
    if hit is None:
        if len(_SELECTED) >= 256:  # bounded whatever the files hold (a host has about 20 protocol lines)
            _SELECTED.clear()
        hit = _SELECTED[protocol, names] = tuple(n for n in names if FIELDS.search(f"{protocol}_{n}"))
    return hit
