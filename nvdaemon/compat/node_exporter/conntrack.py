"""conntrack: ``node_nf_conntrack_*`` from ``<proc>/sys/net/netfilter`` and ``<proc>/net/stat/nf_conntrack``.

``nf_conntrack_count`` / ``nf_conntrack_max`` (decimal) are the table's entries and its limit. The stat file has a
header line, then one line per CPU of 17 hexadecimal columns (entries clashres found new invalid ignore delete
chainlength insert insert_failed drop early_drop icmp_error expect_new expect_create expect_delete
search_restart); node_exporter 1.5 sums eight of them over the CPUs into ``node_nf_conntrack_stat_*`` gauges.
Without the module loaded the files are absent: no data (collector failed), after the families already read.
"""

from __future__ import annotations

from nvdaemon.collectors.base import ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.compat.node_exporter.sysfs import read_int_file
from nvdaemon.goparse import parse_uint, scan_lines

STAT_COLUMNS = 17
# Summed stat columns: (column index, family suffix, HELP).
STATS = (
    (2, "found", "Number of searched entries which were successful."),
    (4, "invalid", "Number of packets seen which can not be tracked."),
    (5, "ignore", "Number of packets seen which are already connected to a conntrack entry."),
    (8, "insert", "Number of entries inserted into the list."),
    (9, "insert_failed", "Number of entries for which list insertion was attempted but failed."),
    (10, "drop", "Number of packets dropped due to conntrack failure."),
    (
        11,
        "early_drop",
        "Number of dropped conntrack entries to make room for new ones, if maximum table size was reached.",
    ),
    (16, "search_restart", "Number of conntrack table lookups which had to be restarted due to hashtable resizes."),
)
_PARSED = (0, *(column for column, _, _ in STATS))  # procfs also validates the entries column


def parse_conntrack_stat(text: str) -> list[int]:
    """The STATS columns summed over the per-CPU lines (uint64 arithmetic, as Go's)."""
    totals = [0] * len(STATS)
    for n, line in enumerate(scan_lines(text)[1:], start=2):
        fields = line.split()
        if len(fields) != STAT_COLUMNS:
            raise ParseError(f"/proc/net/stat/nf_conntrack: line {n}: {len(fields)} fields, expected {STAT_COLUMNS}")
        try:
            values = {i: parse_uint(fields[i], base=16) for i in _PARSED}
        except ValueError as exc:
            raise ParseError(f"/proc/net/stat/nf_conntrack: line {n}: {exc}") from None
        for k, (column, _, _) in enumerate(STATS):
            totals[k] = (totals[k] + values[column]) & ((1 << 64) - 1)
    return totals


def collect(ctx: NodeContext, out: list[Family]) -> None:
    # Emitted one by one, as node_exporter does: a later absent file leaves the earlier families exported.
    out.append(
        gauge(
            "node_nf_conntrack_entries",
            "Number of currently allocated flow entries for connection tracking.",
            read_int_file(ctx, ctx.proc("sys", "net", "netfilter", "nf_conntrack_count")),
        )
    )
    out.append(
        gauge(
            "node_nf_conntrack_entries_limit",
            "Maximum size of connection tracking table.",
            read_int_file(ctx, ctx.proc("sys", "net", "netfilter", "nf_conntrack_max")),
        )
    )
    totals = parse_conntrack_stat(ctx.read(ctx.proc("net", "stat", "nf_conntrack")))
    for (_, suffix, help_text), total in zip(STATS, totals, strict=True):
        out.append(gauge(f"node_nf_conntrack_stat_{suffix}", help_text, total))
