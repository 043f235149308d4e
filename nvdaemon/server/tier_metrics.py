"""Self metrics of the tier loops, so an alert can see a loop that stopped ticking (what ``/healthz`` reports).

``nodevitals_tier_last_tick_timestamp_seconds{tier}``: wall clock (Unix seconds) at which the tier's latest
snapshot was completed (its collection start plus its duration). ``nodevitals_tier_interval_seconds{tier}``: the
tier's configured interval, seconds. A loop is stuck when ``time() - last_tick > 3 * interval``, the rule of
``/healthz``. A timestamp rather than an age: the exposition is rendered once per change and served from a cache,
and a stuck loop changes nothing, so an age computed at render time would freeze; ``time()`` in PromQL does not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from nvdaemon.exposition import GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from nvdaemon.model import TierSnapshot


def tier_self_metrics(snapshots: Mapping[str, TierSnapshot], interval: Callable[[str], float]) -> Iterator[Metric]:
    last = GaugeMetricFamily(
        "nodevitals_tier_last_tick_timestamp_seconds",
        "Unix time at which the tier loop last completed a tick.",
        labels=["tier"],
    )
    every = GaugeMetricFamily(
        "nodevitals_tier_interval_seconds", "Configured interval of the tier loop.", labels=["tier"]
    )
    for tier, snap in sorted(snapshots.items()):
        last.add_metric([tier], snap.collected_at + snap.duration)
        every.add_metric([tier], interval(tier))
    yield last
    yield every
