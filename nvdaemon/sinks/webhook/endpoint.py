"""Webhook delivery: one sink per ``sinks.webhook[]`` endpoint, each with two tasks.

- *ingest* (``nvdaemon.sinks.webhook.spool_writer``) takes what the bus channel holds, commits it to the spool
  (``synchronous=FULL``) and only then forgets it; a write the stateDir refuses (full, read-only) keeps the events in
  a bounded memory buffer and is retried; on shutdown it drains the channel into the spool under a shielded
  two-second deadline, and what is still only in memory when the endpoint is closed (the agent stopping, a reload
  removing it) is dropped and counted (``unspooled_at_stop``). A reload that replaces the endpoint (a setting of it
  changed) hands that memory, what its channel still holds and its counters to the new endpoint (``take_over``);
- *sender* reads the endpoint's oldest pending spooled event and POSTs it (``nvdaemon.sinks.webhook.http``: the
  request, what is read of the answer, its outcome): one request in flight, so a later event never overtakes an
  earlier one; one keep-alive ``httpx.AsyncClient``. A spool write it needs (forgetting a delivered event, counting an
  attempt) that the stateDir refuses is retried before anything else is sent.

What each outcome does to the event: 2xx delivered (row deleted). 408, 429, 5xx, timeouts and connection errors
retry with capped exponential backoff and full jitter (``Retry-After`` honoured, up to an hour) until the event is
``maxAgeHours`` old, then it is a dead letter (``expired``). 410 disables the endpoint (persisted for this URL until
``nvdaemon spool retry``); its events keep being spooled. Any other status is retried ``maxAttempts`` times in all,
then a dead letter (``rejected``). Dead letters stay in the spool (``nvdaemon spool list``, ``nvdaemon spool retry``).

Storage: while the spool cannot be written the endpoint's state is ``degraded`` (``storageError`` says why, and the
supervised task's ``lastError`` in the status document), ``nodevitals_sink_state_writable{sink}`` is 0. A damaged
spool is moved aside (``nvdaemon.sinks.webhook.spool_io``) and delivery goes on with a fresh one; its pending events are
counted as dropped (``spool_corrupt``) when they can be read, and the quarantine is counted either way; the event
whose request was out meanwhile is delivered on a 2xx, else dropped then, never both. Every drop is
counted by reason (``dropped``, ``nodevitals_webhook_dropped_total{sink,reason}``) and logged with its event ids.

Secrets only ever reach the HMAC; URLs only ever appear as ``host[:port]`` in names, logs, metrics and state.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import random
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx
import msgspec
import trio

from nvdaemon.backoff import FULL, backoff
from nvdaemon.bus import EventBus
from nvdaemon.config import SpoolConfig, WebhookSink
from nvdaemon.exposition import Metric
from nvdaemon.shutdown import bounded_shield
from nvdaemon.sinks.base import BusSubscriber, CommitTracker, Sink, SinkContext
from nvdaemon.sinks.spool_clock import SteadyClock, system_clock
from nvdaemon.sinks.webhook import signing
from nvdaemon.sinks.webhook import url as webhook_url
from nvdaemon.sinks.webhook.http import load_keys, open_client, post_event
from nvdaemon.sinks.webhook.metrics import Histogram, Ledger, endpoint_metrics, endpoint_state
from nvdaemon.sinks.webhook.spool import Row, SpoolDB
from nvdaemon.sinks.webhook.spool_io import Spool, SpoolCorrupt, SpoolError, SpoolUnwritable
from nvdaemon.sinks.webhook.spool_writer import BUFFER_EVENTS, RETRY_MAX_SECONDS, UNWRITABLE, SpoolWriter, StorageHealth

log = logging.getLogger("nvdaemon.sinks.webhook")  # the sink's name in log lines, as before it was a package

T = TypeVar("T")
P = ParamSpec("P")
CAPACITY = 10_000  # bus channel: what may wait while ingest commits or the task restarts
IDLE_POLL = 5.0  # re-check the spool this often when idle (``nvdaemon spool retry`` from another process)
READ_AHEAD = 32  # pending rows read per worker-thread call; delivered ones are deleted together (at most resent)
FORGET_ON_STOP_SECONDS = 1.0  # stopping: how long deleting what was delivered may hold up the task's end


class WebhookEndpoint(BusSubscriber, CommitTracker):
    """An ``EventConsumer``, ``Durable`` (the agent saves engine state only after this sink has spooled the events)
    and ``Observable`` sink."""

    capacity = CAPACITY
    critical = False

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
        clock: SteadyClock | None = None,
        jitter: Callable[[], float] = random.random,
        opener: Callable[[Path], SpoolDB] = SpoolDB,
        buffer_events: int = BUFFER_EVENTS,
    ) -> None:
        self.name = name
        self.hook = hook
        self.spool_config = spool_config
        self.state_dir = state_dir
        self.on_change = on_change
        self.transport = transport
        self.wall = wall
        self.clock = clock or system_clock()  # events' ages (maxAgeHours, latency): a clock that does not step
        self.jitter = jitter
        self.opener = opener  # how the spool file is opened (tests: a SpoolDB whose writes fail on demand)
        self.url_hash = webhook_url.url_hash(hook.url)
        self.key_error: str | None = None
        try:
            secrets = load_keys(hook)
            self.keys = [signing.decode_secret(s) for s in secrets]
        except (OSError, ValueError) as exc:  # signing.SecretError, an oversized or non-UTF-8 secretFile
            # The config check read the file a moment ago; report it from the task (restarted with backoff).
            secrets, self.keys = [], []
            self.key_error = f"secretFile unreadable: {getattr(exc, 'strerror', None) or type(exc).__name__}"
        self._key_digest = hashlib.sha256(b"\0".join(self.keys)).hexdigest()
        if any(signing.is_weak(s) for s in secrets):
            log.warning("%s: a secret is shorter than %d bytes; use a whsec_ secret", name, signing.MIN_RAW_KEY_BYTES)
        if any(signing.is_go_raw_whsec(s) for s in secrets):
            log.warning(
                "%s: a whsec_ secret is not base64 after the prefix, so the whole string is the key (as in the Go "
                "agent); Standard Webhooks receivers will not verify it",
                name,
            )
        if not secrets and not self.key_error:
            log.warning("%s: no secret configured; deliveries are unsigned", name)
        # What /metrics and /v1/status show.
        self.status = "active"  # active | backoff | disabled (degraded, while the spool refuses writes, wins)
        self.last_error: str | None = None
        self.last_success: float | None = None
        self.disabled_reason: str | None = None
        self.backlog = 0
        self.dead_letters = 0
        self.attempts: dict[str, int] = {}
        self.ledger = Ledger(name, self._changed)
        self.dropped = self.ledger.dropped  # reason -> events given up on (the same dicts: never rebound)
        self.quarantined = self.ledger.quarantined  # held=counted|unknown -> damaged spool files moved aside
        self.latency = Histogram()
        # Refused spool writes are retried on the endpoint's backoff, capped lower: a freed disk is noticed soon.
        self.health = StorageHealth(
            name, jitter, hook.backoff_base_seconds, min(hook.backoff_max_seconds, RETRY_MAX_SECONDS)
        )
        # The writer (and its memory buffer) belongs to the sink, not to a run of its task: a crash and restart of
        # the task loses nothing it held.
        self.writer = SpoolWriter(
            name,
            spool_config,
            self.health,
            on_drop=self.drop,
            on_committed=self._spooled,
            wall=wall,
            clock=self.clock,
            buffer_events=buffer_events,
        )
        self._kick = trio.Event()
        self._spool: Spool | None = None
        self._quarantines_seen = 0
        self._in_flight: str | None = None  # the event a request is out for
        self._done: list[Row] = []  # delivered, not yet deleted from the spool (``_forget_done``)
        self._forget_refused = False  # the stateDir refused the last delete of ``_done``

    def fingerprint(self) -> Hashable:
        return (
            self.name,
            msgspec.json.encode(msgspec.structs.replace(self.hook, secret="", secrets=[])),
            self._key_digest,
            self.key_error,
            msgspec.json.encode(self.spool_config),
            str(self.state_dir),
        )

    def attach(self, bus: EventBus) -> None:
        super().attach(bus)
        self.start_committed(bus.last_seq)
        self.writer.taken_seq = self.committed_seq

    def take_over(self, old: Sink) -> None:
        """This endpoint replaces ``old`` (a reload changed its settings): the events ``old`` held only in memory
        (its writer's buffer, then what its bus channel still holds) become this one's, oldest first, ahead of
        anything published since; its counters carry on here; persist waits on ``old`` now wait on this one. Its
        delivered rows not yet deleted are deleted by this one (not sent again)."""
        if not isinstance(old, WebhookEndpoint):
            return
        held = old.writer.buffer.take_all()
        writer = self.writer
        for item in held:
            writer.taken_seq = max(writer.taken_seq, item.seq)
            evicted = writer.buffer.add(item)
            if evicted:  # only when this endpoint's buffer is smaller than the old one's
                self.drop(UNWRITABLE, [i.event_id for i in evicted])
        left = old.leftovers()
        for ev in left:
            writer.take(ev)
        # Engine state may be saved only up to the oldest event this endpoint now holds only in memory (set, not
        # raised: on attach it was the bus's last seq, before these events became this endpoint's).
        self.committed_seq = writer.committed_through()
        old.pass_commits_to(self)
        self._done = [*old._done, *self._done]
        old._done = []
        self.ledger.carry_over(old.ledger)
        for outcome, n in old.attempts.items():
            self.attempts[outcome] = self.attempts.get(outcome, 0) + n
        self.latency.add(old.latency)
        self.backlog, self.dead_letters = old.backlog, old.dead_letters  # until this one reads the spool
        self.last_success = old.last_success if self.last_success is None else self.last_success
        if held or left:
            log.info(
                "%s: %d event(s) not yet in the spool taken over from the endpoint it replaces",
                self.name,
                len(held) + len(left),
            )

    def close(self) -> None:
        """Removed or the agent stopping (after the task stopped): events still only in memory, in the writer's
        buffer or still in the bus channel (the writer's final drain stops at a refused write or its deadline), are
        dropped, counted and logged. A replaced endpoint has handed them over already (``take_over``)."""
        super().close()  # no event arrives after this
        left = [i.event_id for i in self.writer.buffer.take_all()]
        left += [ev.id for ev in self.leftovers()]
        self.drop("unspooled_at_stop", left)

    # ---- observability --------------------------------------------------------------------------------------
    def _changed(self) -> None:
        self.on_change()

    def _count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n
        self._changed()

    def drop(self, reason: str, ids: list[str], n: int | None = None) -> None:
        self.ledger.drop(reason, ids, n)

    def dropped_counts(self) -> dict[str, int]:
        return dict(self.dropped)

    def degraded(self) -> str | None:
        return f"spool not writable: {self.health.error}" if self.health.error else None

    def state_writable(self) -> bool | None:
        return self.health.error is None

    def _sync_share(self) -> None:
        spool = self._spool
        db = spool.db if spool is not None else None
        sh = db.cached_share(self.name) if db is not None else None
        if sh is not None:
            # Delivered rows not yet deleted (``_done``) are in the spool's count, but no longer the backlog.
            self.backlog, self.dead_letters = max(0, sh.pending - len(self._done)), sh.dead

    def state(self) -> dict[str, Any]:
        return endpoint_state(self)

    def metrics(self) -> Iterable[Metric]:
        return list(endpoint_metrics(self))

    # ---- the spool ------------------------------------------------------------------------------------------
    async def _call(self, spool: Spool, fn: Callable[Concatenate[SpoolDB, P], T], *args: P.args, **kw: P.kwargs) -> T:
        """``spool.call`` that also accounts for damaged spools moved aside (by this endpoint or another)."""
        try:
            result = await spool.call(fn, *args, **kw)
        except SpoolCorrupt:
            self._note_quarantines(spool)
            raise
        if len(spool.quarantines) > self._quarantines_seen:
            self._note_quarantines(spool)
        return result

    def _note_quarantines(self, spool: Spool) -> None:
        for q in spool.quarantines[self._quarantines_seen :]:
            settled = {r.event_id for r in self._done}
            if self._in_flight is not None:
                settled.add(self._in_flight)
            self.ledger.note_quarantine(q, settled)
        self._quarantines_seen = len(spool.quarantines)
        self.backlog = self.dead_letters = 0
        self._changed()

    # ---- tasks ----------------------------------------------------------------------------------------------
    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.key_error:
            self.last_error = self.key_error
            raise RuntimeError(self.key_error)
        spool = Spool.acquire(self.state_dir, self.opener)
        self._spool = spool
        self._quarantines_seen = len(spool.quarantines)
        try:
            async with open_client(self.hook, self.transport) as client, trio.open_nursery() as nursery:
                nursery.start_soon(self._ingest, spool)
                nursery.start_soon(self._send_loop, spool, client)
                task_status.started()
        finally:
            self._spool = None
            await spool.release()

    async def _ingest(self, spool: Spool) -> None:
        async def call(fn: Callable[..., T], *args: Any) -> T:
            return await self._call(spool, fn, *args)

        await self.writer.run(call, self.events)

    def _spooled(self, seq: int) -> None:
        """The writer committed (or dropped, counted) every event up to ``seq``: tell the agent, wake the sender."""
        self.mark_committed(seq)
        self._sync_share()
        self._changed()
        self._kick.set()

    def _backoff(self, failures: int) -> float:
        """Capped exponential backoff with full jitter."""
        h = self.hook
        return backoff(failures, h.backoff_base_seconds, h.backoff_max_seconds, FULL, self.jitter())

    def _fail(self, error: str, failures: int) -> None:
        if failures == 1:  # once per streak of failures, not once per attempt
            log.warning("%s: delivery failing (%s); retrying with backoff", self.name, error)
        self.last_error = error
        self._changed()

    async def _send_loop(self, spool: Spool, client: httpx.AsyncClient) -> None:
        try:
            await self._send_rows(spool, client)
        finally:
            if self._done:  # stopping: what was delivered is forgotten now, not sent again at the next start
                with bounded_shield(FORGET_ON_STOP_SECONDS), contextlib.suppress(SpoolError):
                    await self._forget_done(spool, 0)

    async def _forget_done(self, spool: Spool, limit: int) -> tuple[list[Row], int]:
        """Delete the delivered rows (``_done``) in one transaction and count them as delivered; read the next
        ``limit`` pending rows and their spool generation in the same worker-thread call. SpoolUnwritable keeps
        ``_done`` for the next try."""
        done = [(r.seq, r.event_id) for r in self._done]
        try:
            ahead, gen = await self._call(spool, _forget, spool, self.name, done, limit)
        except SpoolUnwritable:
            self._forget_refused = bool(done)
            raise
        self._done.clear()
        self._sync_share()
        if self._forget_refused:
            self._forget_refused = False
            self._room_made()  # the deletes refused before went through
        elif done and self.health.error is not None:
            self.writer.wake()  # room made in a full spool
        return ahead, gen

    async def _send_rows(self, spool: Spool, client: httpx.AsyncClient) -> None:
        failures = corrupt_streak = 0
        rejections, rejected_seq = 0, -1
        # Read-ahead: up to READ_AHEAD pending rows, oldest first, and the spool generation they were read from.
        # Delivered rows go to ``_done`` and are deleted together once the read-ahead is used up (in the same call as
        # the next read) or before anything else is written or waited for: one worker-thread call and one
        # transaction per READ_AHEAD deliveries, not per event. A crash can only resend those (at least once).
        ahead: list[Row] = []
        gen = 0
        refresh = True  # read this endpoint's disabled flag and share (at start, and from a fresh spool)
        while True:
            try:
                if refresh:
                    self.disabled_reason = await self._call(spool, SpoolDB.disabled, self.name, self.url_hash)
                    await self._call(spool, SpoolDB.share, self.name, True)
                    self._sync_share()
                    refresh = False
                corrupt_streak = 0
                if self.disabled_reason is not None:
                    if self._done:
                        await self._forget_done(spool, 0)
                    self.status = "disabled"
                    await trio.sleep(IDLE_POLL)
                    self.disabled_reason = await self._call(spool, SpoolDB.disabled, self.name, self.url_hash)
                    continue
                if not ahead:
                    self._kick = trio.Event()
                    ahead, gen = await self._forget_done(spool, READ_AHEAD)
                if not ahead:
                    self.status = "active"
                    with trio.move_on_after(IDLE_POLL) as idle:
                        await self._kick.wait()
                    if idle.cancelled_caught:
                        await self._call(spool, SpoolDB.share, self.name, True)
                        self._sync_share()
                    continue
                row = ahead.pop(0)
                if gen != len(spool.quarantines):
                    ahead = []
                    continue  # read from a file since moved aside, and counted with it: never sent
                if row.age(self.clock, self.wall()) > self.hook.max_age_hours * 3600:
                    await self._bury(spool, row, row.attempts, "expired")
                    continue
                self._in_flight, outcome = row.event_id, ""
                try:
                    outcome, error, wait = await post_event(client, self.hook, self.keys, self.wall, row.body)
                    if outcome == "success":
                        self._done.append(row)
                    if len(spool.quarantines) > self._quarantines_seen:
                        self._note_quarantines(spool)  # moved aside meanwhile: this event is the request's to count
                finally:
                    self._in_flight = None
                if outcome == "success":
                    self._sync_share()  # no longer in the backlog: state and counters agree
                    self._count(self.attempts, outcome)
                    if failures:
                        log.info("%s: delivering again after %d failed attempt(s)", self.name, failures)
                    failures = 0
                    self.status, self.last_error, self.last_success = "active", None, self.wall()
                    self.latency.observe(row.age(self.clock, self.last_success))
                    continue
                ahead = []  # read again after this failure, from the failed row on (still pending)
                self._count(self.attempts, outcome)
                assert error is not None
                if gen != len(spool.quarantines):  # its file was moved aside while the request was out
                    self.drop("spool_corrupt", [row.event_id])
                    continue
                if self._done:
                    await self._forget_done(spool, 0)  # before a backoff, a dead letter or disabling
                if outcome == "gone":
                    log.error(
                        "%s: the receiver answered 410 Gone; endpoint disabled until `nvdaemon spool retry`", self.name
                    )
                    await self._call(spool, SpoolDB.disable, self.name, self.url_hash, error)
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
                    await self._bury(spool, row, attempts, "rejected", error)
                    continue
                self.status = "backoff"
                await self._call(spool, SpoolDB.attempted, row.seq, row.event_id, attempts, error)
                await trio.sleep(wait if wait is not None else self._backoff(failures))
                self.status = "active"
            except SpoolUnwritable as exc:
                self.health.failed(str(exc))
                self._changed()
                await trio.sleep(self.health.delay())
            except SpoolCorrupt:
                # A fresh spool: nothing read from the old one is valid (its events were counted as dropped; the
                # delivered ones it still held were not, see ``_note_quarantines``).
                ahead, refresh, self._in_flight = [], True, None
                self._done.clear()
                corrupt_streak += 1
                if corrupt_streak > 1:
                    await trio.sleep(self.health.delay())

    def _room_made(self) -> None:
        """A delete refused before went through: the writer may now find room."""
        self.health.ok()
        self.writer.wake()
        self._sync_share()
        self._changed()

    async def _bury(self, spool: Spool, row: Row, attempts: int, reason: str, error: str = "") -> None:
        buried = await self._call(
            spool, SpoolDB.bury, self.name, row.seq, row.event_id, attempts, reason, error or reason
        )
        if buried:
            log.info(
                "%s: event %s is a dead letter (%s) after %d attempt(s)", self.name, row.event_id, reason, attempts
            )
            self.drop(reason, [row.event_id])
        self._sync_share()


def build(ctx: SinkContext) -> list[Sink]:
    hooks = ctx.webhooks
    names = webhook_url.endpoint_names([h.url for h in hooks])
    return [
        WebhookEndpoint(name, hook, ctx.spool, ctx.state_dir, on_change=ctx.note_change)
        for name, hook in zip(names, hooks, strict=True)
    ]


def _forget(db: SpoolDB, spool: Spool, endpoint: str, done: list[tuple[int, str]], limit: int) -> tuple[list[Row], int]:
    """Delete delivered rows; the next ``limit`` pending rows and the generation of the spool file they were read
    from (its count of quarantines, read in the same worker-thread call, so no quarantine can come between)."""
    return db.forget(endpoint, done, limit), len(spool.quarantines)
