"""Webhook delivery: one sink per ``sinks.webhook[]`` endpoint, each with two tasks.

- *ingest* takes what the bus channel holds (a batch of whatever is there), commits it to the spool
  (``synchronous=FULL``) and only then takes the next; on shutdown it drains the channel into the spool under a
  shielded two-second deadline;
- *sender* reads the endpoint's oldest pending spooled event and POSTs it: one request in flight, so a later event
  never overtakes an earlier one; one keep-alive ``httpx.AsyncClient``.

Outcomes: 2xx delivered (row deleted). 408, 429, 5xx, timeouts and connection errors retry with capped exponential
backoff and full jitter (``Retry-After`` honoured, up to an hour) until the event is ``maxAgeHours`` old, then it is a
dead letter (``expired``). 410 disables the endpoint (persisted for this URL until ``nvdaemon spool retry``); its
events keep being spooled. Any other status is retried ``maxAttempts`` times in all, then a dead letter
(``rejected``). Dead letters stay in the spool (``nvdaemon spool list``, ``nvdaemon spool retry``).

Secrets only ever reach the HMAC; URLs only ever appear as ``host[:port]`` in names, logs, metrics and state.
"""

from __future__ import annotations

import email.utils
import hashlib
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import msgspec
import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from nvdaemon.config import SpoolConfig, WebhookSink
from nvdaemon.model import Event, Severity
from nvdaemon.sinks import Sink, cloudevent, signing, webhook_url
from nvdaemon.sinks.spool import Row, Spool

if TYPE_CHECKING:
    from nvdaemon.app import Agent

log = logging.getLogger(__name__)
# httpx logs every request with its full URL at INFO; a URL may carry credentials.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

CAPACITY = 10_000  # bus channel: what may wait while ingest commits or the task restarts
BATCH = 1000
IDLE_POLL = 5.0  # re-check the spool this often when idle (``nvdaemon spool retry`` from another process)
RETRY_AFTER_CAP = 3600.0
DRAIN_SECONDS = 2.0
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)
TRANSIENT = frozenset({408, 429})


def load_keys(hook: WebhookSink) -> list[str]:
    """The configured secrets, newest first; a secretFile holds one per line. Raises OSError for the file."""
    if hook.secret_file:
        text = Path(hook.secret_file).read_text(encoding="utf-8")
        return [line.strip() for line in text.splitlines() if line.strip()]
    return list(hook.secrets) if hook.secrets else [hook.secret] if hook.secret else []


def severity_rank(severity: str) -> int:
    """Overflow order: lower ranks go first; an unknown severity counts as info."""
    try:
        return int(Severity.parse(severity))
    except KeyError:
        return int(Severity.INFO)


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_CAP)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return min(max(0.0, when - now), RETRY_AFTER_CAP)


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


class WebhookEndpoint(Sink):
    capacity = CAPACITY
    durable = True  # the agent saves engine state only after this sink has spooled the events

    def __init__(
        self,
        name: str,
        hook: WebhookSink,
        spool_config: SpoolConfig,
        state_dir: Path,
        *,
        on_change: Callable[[], None] = lambda: None,
        transport: httpx.AsyncBaseTransport | None = None,
        wall: Callable[[], float] = time.time,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.name = name
        self.hook = hook
        self.spool_config = spool_config
        self.state_dir = state_dir
        self.on_change = on_change
        self.transport = transport
        self.wall = wall
        self.jitter = jitter
        self.url_hash = webhook_url.url_hash(hook.url)
        self.key_error: str | None = None
        try:
            secrets = load_keys(hook)
            self.keys = [signing.decode_secret(s) for s in secrets]
        except (OSError, signing.SecretError) as exc:
            # The config check read the file a moment ago; report it from the task (restarted with backoff).
            secrets, self.keys = [], []
            self.key_error = f"secretFile unreadable: {getattr(exc, 'strerror', None) or type(exc).__name__}"
        self._key_digest = hashlib.sha256(b"\0".join(self.keys)).hexdigest()
        if any(signing.is_weak(s) for s in secrets):
            log.warning("%s: a secret is shorter than %d bytes; use a whsec_ secret", name, signing.MIN_RAW_KEY_BYTES)
        if not secrets and not self.key_error:
            log.warning("%s: no secret configured; deliveries are unsigned", name)
        # What /metrics and /v1/status show.
        self.status = "active"  # active | backoff | disabled
        self.last_error: str | None = None
        self.last_success: float | None = None
        self.disabled_reason: str | None = None
        self.backlog = 0
        self.dead_letters = 0
        self.attempts: dict[str, int] = {}
        self.dropped: dict[str, int] = {}
        self.latency = Histogram()
        self._kick = trio.Event()
        self._spool: Spool | None = None

    def fingerprint(self) -> Hashable:
        return (
            self.name,
            msgspec.json.encode(msgspec.structs.replace(self.hook, secret="", secrets=[])),
            self._key_digest,
            self.key_error,
            msgspec.json.encode(self.spool_config),
            str(self.state_dir),
        )

    # ---- observability --------------------------------------------------------------------------------------
    def _changed(self) -> None:
        self.on_change()

    def _count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n
        self._changed()

    def _sync_share(self) -> None:
        if self._spool is not None:
            sh = self._spool.db.share(self.name)  # a cached dict read; the counts change only under the limiter
            self.backlog, self.dead_letters = sh.pending, sh.dead

    def state(self) -> dict[str, Any]:
        return {
            "endpoint": webhook_url.host_port(self.hook.url),
            "mode": self.hook.mode,
            "state": self.status,
            "backlog": self.backlog,
            "deadLetters": self.dead_letters,
            "lastError": self.last_error,
            "lastSuccess": self.last_success,
            "disabledReason": self.disabled_reason,
            "attempts": dict(self.attempts),
            "dropped": dict(self.dropped),
        }

    def metrics(self) -> Iterable[Metric]:
        return list(self._metrics())

    def _metrics(self) -> Iterator[Metric]:
        s = [self.name]
        attempts = CounterMetricFamily(
            "nodevitals_delivery_attempts", "Webhook delivery attempts by outcome.", labels=["sink", "outcome"]
        )
        for outcome, n in sorted(self.attempts.items()):
            attempts.add_metric([*s, outcome], n)
        # Per reason; nodevitals_delivery_dropped_total{sink} (Go's label set) is their sum, in server/metrics.py.
        dropped = CounterMetricFamily(
            "nodevitals_webhook_dropped",
            "Events given up on: spool overflow (spool_full_events, spool_full_bytes) or dead-lettered (expired, "
            "rejected).",
            labels=["sink", "reason"],
        )
        for reason, n in sorted(self.dropped.items()):
            dropped.add_metric([*s, reason], n)
        backlog = GaugeMetricFamily("nodevitals_delivery_backlog", "Spooled events not yet delivered.", labels=["sink"])
        backlog.add_metric(s, self.backlog)
        dead = GaugeMetricFamily(
            "nodevitals_delivery_dead_letters", "Dead letters kept in the spool for inspection.", labels=["sink"]
        )
        dead.add_metric(s, self.dead_letters)
        disabled = GaugeMetricFamily(
            "nodevitals_delivery_endpoint_disabled",
            "1 if the endpoint answered 410 Gone and is disabled.",
            labels=["sink"],
        )
        disabled.add_metric(s, 1.0 if self.status == "disabled" else 0.0)
        yield from (attempts, dropped, backlog, dead, disabled)
        if self.last_success is not None:
            last = GaugeMetricFamily(
                "nodevitals_delivery_last_success_timestamp_seconds", "When the last 2xx was received.", labels=["sink"]
            )
            last.add_metric(s, self.last_success)
            yield last
        latency = HistogramMetricFamily(
            "nodevitals_delivery_latency_seconds",
            "Seconds from an event entering the spool to the receiver's 2xx.",
            labels=["sink"],
        )
        cumulative = [(str(le), float(n)) for le, n in zip(BUCKETS, self.latency.buckets, strict=True)]
        latency.add_metric(s, [*cumulative, ("+Inf", float(self.latency.count))], self.latency.total)
        yield latency

    # ---- tasks ----------------------------------------------------------------------------------------------
    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.key_error:
            self.last_error = self.key_error
            raise RuntimeError(self.key_error)
        spool = await Spool.open(self.state_dir)
        self._spool = spool
        try:
            self.disabled_reason = await spool.call(spool.db.disabled, self.name, self.url_hash)
            await spool.call(spool.db.share, self.name, True)
            self._sync_share()
            timeout = httpx.Timeout(self.hook.timeout_seconds)
            async with (
                httpx.AsyncClient(transport=self.transport, timeout=timeout, follow_redirects=False) as client,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(self._ingest, spool)
                nursery.start_soon(self._send_loop, spool, client)
                task_status.started()
        finally:
            self._spool = None
            await spool.aclose()

    async def _commit(self, spool: Spool, batch: list[Event]) -> None:
        items = [(ev.id, severity_rank(ev.severity), msgspec.json.encode(ev)) for ev in batch]
        sc = self.spool_config
        # Shielded: these events are already off the channel, so a cancellation here would lose them.
        with trio.CancelScope(shield=True):
            drops = await spool.call(spool.db.add, self.name, items, sc.max_events, sc.max_bytes, self.wall())
        self.mark_committed(max(ev.seq for ev in batch))
        for reason, n in drops.items():
            if n:
                log.warning("%s: spool full (%s): dropped %d oldest lowest-severity event(s)", self.name, reason, n)
                self._count(self.dropped, reason, n)
        self._sync_share()
        self._changed()
        self._kick.set()

    def _take_available(self, batch: list[Event]) -> list[Event]:
        while len(batch) < BATCH:
            try:
                batch.append(self.events.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        return batch

    async def _ingest(self, spool: Spool) -> None:
        try:
            async for first in self.events:
                await self._commit(spool, self._take_available([first]))
        finally:
            # Shutdown: whatever is already in the channel goes to the spool before the task ends.
            with trio.CancelScope(shield=True), trio.move_on_after(DRAIN_SECONDS):
                while batch := self._take_available([]):
                    await self._commit(spool, batch)

    def _backoff(self, failures: int) -> float:
        """Capped exponential backoff with full jitter."""
        h = self.hook
        ceiling = min(h.backoff_max_seconds, h.backoff_base_seconds * float(2 ** min(failures - 1, 60)))
        return ceiling * self.jitter()

    def _fail(self, error: str, failures: int) -> None:
        if failures == 1:  # once per streak of failures, not once per attempt
            log.warning("%s: delivery failing (%s); retrying with backoff", self.name, error)
        self.last_error = error
        self._changed()

    async def _send_loop(self, spool: Spool, client: httpx.AsyncClient) -> None:
        db = spool.db
        failures = 0
        rejections, rejected_seq = 0, -1
        prefetched: tuple[Row | None] | None = None
        while True:
            if self.disabled_reason is not None:
                self.status = "disabled"
                await trio.sleep(IDLE_POLL)
                self.disabled_reason = await spool.call(db.disabled, self.name, self.url_hash)
                continue
            if prefetched is not None:
                row, prefetched = prefetched[0], None  # read right after the last delivery, one thread hop fewer
            else:
                self._kick = trio.Event()
                row = await spool.call(db.head, self.name)
            if row is None:
                self.status = "active"
                with trio.move_on_after(IDLE_POLL) as idle:
                    await self._kick.wait()
                if idle.cancelled_caught:
                    await spool.call(db.share, self.name, True)
                    self._sync_share()
                continue
            if self.wall() - row.enqueued > self.hook.max_age_hours * 3600:
                await self._bury(spool, row.seq, row.attempts, "expired", row.event_id)
                continue
            outcome, error, wait = await self._attempt(client, row.body)
            if outcome == "success":
                self._kick = trio.Event()
                prefetched = (await spool.call(db.delivered, self.name, row.seq),)
                if failures:
                    log.info("%s: delivering again after %d failed attempt(s)", self.name, failures)
                failures = 0
                self.status, self.last_error, self.last_success = "active", None, self.wall()
                self.latency.observe(max(0.0, self.last_success - row.enqueued))
                self._sync_share()
                self._count(self.attempts, outcome)  # after the spool forgot it: state and counters agree
                continue
            self._count(self.attempts, outcome)
            assert error is not None
            if outcome == "gone":
                log.error(
                    "%s: the receiver answered 410 Gone; endpoint disabled until `nvdaemon spool retry`", self.name
                )
                await spool.call(db.disable, self.name, self.url_hash, error)
                self.disabled_reason, self.last_error = error, error
                self._changed()
                continue
            failures += 1
            attempts = row.attempts + 1
            self._fail(error, failures)
            # maxAttempts counts the rejections of this event (transient failures are bounded by maxAgeHours).
            rejections = (
                rejections + 1 if outcome == "rejected" and rejected_seq == row.seq else int(outcome == "rejected")
            )
            rejected_seq = row.seq
            if outcome == "rejected" and rejections >= self.hook.max_attempts:
                await self._bury(spool, row.seq, attempts, "rejected", row.event_id, error)
                continue
            await spool.call(db.attempted, row.seq, attempts, error)
            self.status = "backoff"
            await trio.sleep(wait if wait is not None else self._backoff(failures))
            self.status = "active"

    async def _bury(self, spool: Spool, seq: int, attempts: int, reason: str, event_id: str, error: str = "") -> None:
        log.warning("%s: event %s is a dead letter (%s) after %d attempt(s)", self.name, event_id, reason, attempts)
        await spool.call(spool.db.bury, self.name, seq, attempts, reason, error or reason)
        self._count(self.dropped, reason)
        self._sync_share()

    async def _attempt(self, client: httpx.AsyncClient, stored: bytes) -> tuple[str, str | None, float | None]:
        """POST one event; ``(outcome, error, Retry-After seconds)``."""
        event = msgspec.json.decode(stored, type=Event)
        headers, body = cloudevent.encode(event, self.hook.mode)
        headers = {**self.hook.headers, **headers}
        headers |= signing.sign_headers(self.keys, event.id, int(self.wall()), body)
        timeout = self.hook.timeout_seconds
        try:
            with trio.fail_after(timeout * 2):  # httpx's timeouts are per phase; this bounds the whole request
                resp = await client.post(self.hook.url, content=body, headers=headers)
        except (httpx.TimeoutException, trio.TooSlowError):
            return "timeout", f"no response within {timeout:g}s", None
        except httpx.TransportError as exc:
            text = webhook_url.redact(str(exc), self.hook.url)
            return "connection_error", f"{type(exc).__name__}: {text}" if text else type(exc).__name__, None
        code = resp.status_code
        error = f"HTTP {code}"
        if 200 <= code < 300:
            return "success", None, None
        if code == 410:
            return "gone", error, None
        if code in TRANSIENT or code >= 500:
            return "retryable", error, retry_after(resp.headers.get("retry-after"), self.wall())
        return "rejected", error, None


def _bump(agent: Agent) -> Callable[[], None]:
    def bump() -> None:
        agent.changes += 1

    return bump


def build(agent: Agent) -> list[Sink]:
    cfg = agent.loaded.config
    hooks = cfg.sinks.webhook
    names = webhook_url.endpoint_names([h.url for h in hooks])
    return [
        WebhookEndpoint(name, hook, cfg.spool, agent.loaded.state_dir, on_change=_bump(agent))
        for name, hook in zip(names, hooks, strict=True)
    ]
