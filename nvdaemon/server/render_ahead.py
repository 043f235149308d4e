"""Rendering ``/metrics`` right after a tier's tick, when scrapes come as often as the page changes.

The page is rendered from the snapshots (``MetricsCache``); lazily, a scrape that finds them changed renders it.
That scrape comes seconds after the tick, and by then what the render reads (the tick's families and samples, the
render's code) has left the CPU's caches. On the 2-CPU test VM, a core agent with the node_* surface on gpunode,
ticking every 15 s and scraped (gzip) 7.5 s after each tick, spent 5.7 ms of CPU on a scrape that rendered and
1.9 ms on one that found the page made (10 cycles, an agent of each kind side by side), where the render right
after the tick costs about 2.1 ms (``bench/tick.py``'s render row). Over whole 15 s cycles, two agents of each
kind: 19.1 and 18.6 ms of CPU a cycle rendering at the scrape, 17.5 and 17.7 rendering ahead (10 cycles).

Rendering ahead is worth it only when the page it makes will be asked for: with Prometheus scraping every 60 s
and the tier ticking every 15 s, three pages of four would be rendered for nobody. So it renders ahead only
while the scrapes come at least as often as the tier ticks (``ScrapeGaps``: the last gap between two scrapes at
most ``SLACK`` times the tier's interval, and the last scrape no older than that), and compresses only when the
latest scrape asked for gzip. Otherwise the page waits for its scrape, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import trio

from nvdaemon.model import TierSnapshot
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.view import AgentView

log = logging.getLogger(__name__)

SLACK = 1.25  # a scrape interval this much longer than the tick's still counts as one scrape a tick (jitter)


def ticked(before: Mapping[str, TierSnapshot], now: Mapping[str, TierSnapshot]) -> list[str]:
    """The tiers whose snapshot is another object in ``now`` than in ``before``."""
    return [tier for tier, snap in now.items() if before.get(tier) is not snap]


def worth_ahead(last_gap: float | None, since_last: float, interval: float) -> bool:
    """Whether the next scrape will likely ask for the page a tier of this ``interval`` (s) just made: the latest
    gap between two scrapes (None: fewer than two so far) and the time since the latest scrape are both within
    ``SLACK`` intervals."""
    limit = SLACK * interval
    return last_gap is not None and last_gap <= limit and since_last <= limit


async def serve_render_ahead(
    view: AgentView, metrics: MetricsCache, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """After each new snapshot of a tier scraped about as often as it ticks, render the page (``metrics.prepare``).
    Runs until cancelled. A render that fails is logged (once per distinct error) and left to the next scrape,
    which renders again and answers 500 if it fails the same way."""
    seen = view.snapshot_version
    snaps = dict(view.snapshots)
    last_error = ""
    task_status.started()
    while True:
        seen = await view.next_snapshot(seen)
        now_snaps = dict(view.snapshots)
        tiers = ticked(snaps, now_snaps)
        snaps = now_snaps
        gaps = metrics.scrape_gaps
        since = gaps.since_last()
        if not any(worth_ahead(gaps.last_gap, since, view.interval(tier)) for tier in tiers):
            continue
        try:
            metrics.prepare(gzip=gaps.last_gzip)
        except Exception as exc:
            if str(exc) != last_error:
                last_error = str(exc)
                log.warning("rendering /metrics after a tick failed (left to the next scrape): %s", exc, exc_info=True)
