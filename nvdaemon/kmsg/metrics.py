"""The kernel-log source's families on ``/metrics`` (``nodevitals_kmsg_*``), from a running source's counters."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from nvdaemon.kmsg.source import KmsgSource


def kmsg_metrics(source: KmsgSource | None) -> Iterator[Metric]:
    """Nothing when the source is off (kernelLog.enabled false); ``up`` 0 while it cannot read."""
    if source is None:
        return
    c = source.counters
    up = GaugeMetricFamily(
        "nodevitals_kmsg_up", "1 while the kernel log (/dev/kmsg) is open and read; 0 when absent or unreadable."
    )
    up.add_metric([], 1.0 if source.up else 0.0)
    yield up
    yield CounterMetricFamily("nodevitals_kmsg_records_read", "Kernel log records read.", c.read)
    yield CounterMetricFamily(
        "nodevitals_kmsg_records_parsed", "Kernel log records matched against patterns.", c.parsed
    )
    doc = "Kernel log records that matched, by rule (condition, or xid/sxid/...)."
    yield _by_label(CounterMetricFamily("nodevitals_kmsg_matches", doc, labels=["rule"]), c.matches)
    yield CounterMetricFamily(
        "nodevitals_kmsg_overruns",
        "Reads answered EPIPE: records overwritten before they were read.",
        source.reader.overruns,
    )
    yield CounterMetricFamily(
        "nodevitals_kmsg_records_lost", "Records missing from the sequence (overwritten unread).", c.lost
    )
    why = (
        "Records not matched: over the per-second budget, older than the lookback, read before a restart, malformed, "
        "written by a process (not the kernel)."
    )
    yield _by_label(CounterMetricFamily("nodevitals_kmsg_skipped", why, labels=["reason"]), c.skipped)
    yield CounterMetricFamily("nodevitals_kmsg_truncated", "Records cut at kernelLog.maxRecordBytes.", c.truncated)


def _by_label(family: CounterMetricFamily, counts: Mapping[str, int]) -> CounterMetricFamily:
    """``family`` with one series per key of ``counts`` (sorted)."""
    for value, n in sorted(counts.items()):
        family.add_metric([value], n)
    return family
