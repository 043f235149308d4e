"""What a webhook endpoint shows in /metrics and in /v1/status (built from its counters; no I/O), and its ledger of
what it gave up on: every drop counted by reason and logged with its event ids (``extra={"dropped": ...}`` in JSON logs,
which the soak reads), and the damaged spools it saw moved aside."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from nvdaemon.sinks.webhook import url as webhook_url

if TYPE_CHECKING:
    from nvdaemon.config import WebhookSink
    from nvdaemon.sinks.webhook.spool_io import Quarantine
    from nvdaemon.sinks.webhook.spool_writer import SpoolWriter, StorageHealth

log = logging.getLogger(__name__)

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
DROP_REASONS = (
    "spool_full_events, spool_full_bytes (spool over its bound), spool_unwritable (stateDir refused writes and the "
    "in-memory buffer was full), spool_corrupt (pending in a damaged spool that was moved aside), "
    "unspooled_at_stop (in memory when the endpoint was removed or the agent stopped), expired, rejected "
    "(dead letters)"
)


@dataclass
class Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    count: int = 0
    total: float = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        for i, le in enumerate(BUCKETS):
            if value <= le:
                self.buckets[i] += 1

    def add(self, other: Histogram) -> None:
        """Count ``other``'s observations too (a replaced endpoint's: the histogram never goes back)."""
        self.count += other.count
        self.total += other.total
        self.buckets = [a + b for a, b in zip(self.buckets, other.buckets, strict=True)]


class Ledger:
    def __init__(self, name: str, on_change: Callable[[], None]) -> None:
        self.name = name
        self.on_change = on_change
        self.dropped: dict[str, int] = {}
        self.quarantined: dict[str, int] = {}
        self.quarantine_log: list[dict[str, Any]] = []  # the last few, for the status document

    def drop(self, reason: str, ids: list[str], n: int | None = None) -> None:
        """Count events given up on (``n`` when their ids are unknown) and log them with their ids."""
        count = len(ids) if n is None else n
        if not count:
            return
        log.warning(
            "%s: dropped %d event(s) (%s): %s",
            self.name,
            count,
            reason,
            " ".join(ids) if ids else "ids unknown",
            extra={"dropped": {"sink": self.name, "reason": reason, "count": count, "ids": ids}},
        )
        self.dropped[reason] = self.dropped.get(reason, 0) + count
        self.on_change()

    def carry_over(self, old: Ledger) -> None:
        """Add the counts of the endpoint this one replaces (in place: the endpoint holds these very dicts), so
        the counters in /metrics never go back across a reload."""
        for mine, theirs in ((self.dropped, old.dropped), (self.quarantined, old.quarantined)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        self.quarantine_log = [*old.quarantine_log, *self.quarantine_log][-5:]
        self.on_change()

    def note_quarantine(self, q: Quarantine, settled: Collection[str] = ()) -> None:
        """A damaged spool was moved aside: its pending events of this endpoint are dropped (by id where the moved
        copy could be read; by the count this process had; else the quarantine is counted as ``unknown``). The
        events ``settled`` (a request out, or delivered and not yet deleted) are left to their request's outcome: a
        2xx delivered it, anything else is the endpoint's drop to count."""
        # Taken out of the record: the spool keeps its records for the process's life, the ids only until noted.
        ids = [i for i in q.held.pop(self.name, []) if i not in settled] if q.held is not None else []
        n: int | None = len(ids) if q.held is not None else q.counted.get(self.name)
        if q.held is None and n:
            n = max(0, n - len(settled))
        log.error(
            "%s: the spool was damaged (%s) and moved to %s; delivery goes on with a fresh spool; it held %s pending "
            "event(s) of this endpoint",
            self.name,
            q.why,
            q.moved,
            "an unknown number of" if n is None else n,
        )
        held = "unknown" if n is None else "counted"
        self.quarantined[held] = self.quarantined.get(held, 0) + 1
        self.quarantine_log = [
            *self.quarantine_log[-4:],
            {"file": str(q.moved), "at": q.at, "reason": q.why, "events": "unknown" if n is None else n},
        ]
        self.on_change()
        if n:
            self.drop("spool_corrupt", ids, n)


class Endpoint(Protocol):
    """What the status entry and the series read of an endpoint (``endpoint.WebhookEndpoint``, which
    imports this module: the shape is declared here so that this module needs nothing of the endpoint's)."""

    name: str
    hook: WebhookSink
    status: str  # active | backoff | disabled
    backlog: int  # spooled, not yet delivered
    dead_letters: int
    last_error: str | None
    last_success: float | None  # wall-clock seconds
    disabled_reason: str | None
    attempts: dict[str, int]  # outcome -> delivery attempts
    dropped: dict[str, int]  # reason -> events given up on (the ledger's)
    quarantined: dict[str, int]  # held=counted|unknown -> damaged spools moved aside (the ledger's)
    ledger: Ledger
    latency: Histogram  # seconds from spooled to a 2xx
    health: StorageHealth  # ``error``: why the spool refuses writes, else None
    writer: SpoolWriter  # ``buffer``: events held only in memory


def endpoint_state(ep: Endpoint) -> dict[str, Any]:
    """The endpoint's entry in the status document (``/v1/status``): its URL only as ``host[:port]``."""
    return {
        "endpoint": webhook_url.host_port(ep.hook.url),
        "mode": ep.hook.mode,
        "state": "degraded" if ep.health.error else ep.status,
        "backlog": ep.backlog,
        "unspooled": len(ep.writer.buffer),
        "deadLetters": ep.dead_letters,
        "lastError": ep.last_error,
        "lastSuccess": ep.last_success,
        "disabledReason": ep.disabled_reason,
        "stateWritable": ep.health.error is None,
        "storageError": ep.health.error,
        "attempts": dict(ep.attempts),
        "dropped": dict(ep.dropped),
        "quarantines": list(ep.ledger.quarantine_log),
    }


def endpoint_metrics(ep: Endpoint) -> Iterator[Metric]:
    s = [ep.name]
    attempts = CounterMetricFamily(
        "nodevitals_delivery_attempts", "Webhook delivery attempts by outcome.", labels=["sink", "outcome"]
    )
    for outcome, n in sorted(ep.attempts.items()):
        attempts.add_metric([*s, outcome], n)
    # Per reason; nodevitals_delivery_dropped_total{sink} (the Go agent's series) is their sum.
    dropped = CounterMetricFamily(
        "nodevitals_webhook_dropped",
        f"Events a webhook endpoint gave up on, by reason: {DROP_REASONS}.",
        labels=["sink", "reason"],
    )
    for why, n in sorted(ep.dropped.items()):
        dropped.add_metric([*s, why], n)
    backlog = GaugeMetricFamily("nodevitals_delivery_backlog", "Spooled events not yet delivered.", labels=["sink"])
    backlog.add_metric(s, ep.backlog)
    unspooled = GaugeMetricFamily(
        "nodevitals_webhook_unspooled",
        "Events held in memory because the spool could not be written yet (not safe from a crash).",
        labels=["sink"],
    )
    unspooled.add_metric(s, len(ep.writer.buffer))
    dead = GaugeMetricFamily(
        "nodevitals_delivery_dead_letters", "Dead letters kept in the spool for inspection.", labels=["sink"]
    )
    dead.add_metric(s, ep.dead_letters)
    disabled = GaugeMetricFamily(
        "nodevitals_delivery_endpoint_disabled", "1 if the endpoint answered 410 Gone and is disabled.", labels=["sink"]
    )
    disabled.add_metric(s, 1.0 if ep.status == "disabled" else 0.0)
    quarantines = CounterMetricFamily(
        "nodevitals_webhook_spool_quarantines",
        "Damaged spool files moved aside (and replaced by a fresh one); held=unknown when the pending events it held "
        "could not be counted.",
        labels=["sink", "held"],
    )
    for held, n in sorted(ep.quarantined.items()):
        quarantines.add_metric([*s, held], n)
    yield from (attempts, dropped, backlog, unspooled, dead, disabled, quarantines)
    if ep.last_success is not None:
        last = GaugeMetricFamily(
            "nodevitals_delivery_last_success_timestamp_seconds", "When the last 2xx was received.", labels=["sink"]
        )
        last.add_metric(s, ep.last_success)
        yield last
    latency = HistogramMetricFamily(
        "nodevitals_delivery_latency_seconds",
        "Seconds from an event entering the spool to the receiver's 2xx.",
        labels=["sink"],
    )
    cumulative = [(str(le), float(n)) for le, n in zip(BUCKETS, ep.latency.buckets, strict=True)]
    latency.add_metric(s, [*cumulative, ("+Inf", float(ep.latency.count))], ep.latency.total)
    yield latency
