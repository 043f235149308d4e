"""Self metrics of the smart tier: which disks could be read, and the parse errors met per disk.

``nodevitals_smart_device_readable{device}`` is 1 when the last cycle got SMART data for the disk (or found it
asleep in standby, which is left alone) and 0 otherwise: an unprivileged pod, a missing capability, a smartctl that
timed out or printed what cannot be parsed. The Go agent reported zero series there and looked healthy.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from nvdaemon.collectors.smart import smart_result
from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, Metric


def smart_self_metrics(snapshots: Mapping[str, Any]) -> Iterator[Metric]:
    result = smart_result(snapshots)
    if result is None:
        return
    readable = GaugeMetricFamily(
        "nodevitals_smart_device_readable",
        "1 if smartctl returned usable SMART data for the disk on the last cycle (or it sleeps in standby); "
        "0: unreadable, see /v1/status tiers.smart.collectors.smart.detail for why.",
        labels=["device"],
    )
    parse_errors = CounterMetricFamily(
        "nodevitals_smart_parse_errors",
        "Cycles whose smartctl output for the disk could not be parsed (garbage or cut short); the disk was skipped.",
        labels=["device"],
    )
    for name, st in sorted(result.status.items()):
        readable.add_metric([name], 1.0 if st.readable else 0.0)
        parse_errors.add_metric([name], st.parse_errors)
    yield readable
    yield parse_errors
