"""The websocket hub: a sink that keeps a ring buffer of recent events and fans each one out to live clients.

Every event is encoded once, for every client: the CloudEvent JSON the webhook sends (``cloudevent.encode``,
structured mode) inside one complete websocket text frame (``Frame``: RFC 6455, FIN, unmasked, as a server sends).
That same ``Frame`` object is handed to each client whose filters match through the client's own bounded queue
with ``send_nowait``, and the route writes its bytes as they are (``nvdaemon/server/asgi.py``,
``BoundedWSStream.write_frames``), several queued frames in one socket write; no per-client JSON or frame encode.
A client whose queue is full has fallen too far behind: it is closed with code 1013 ("try again later") and
counted under ``nodevitals_stream_disconnects_total{reason="slow"}``; neither the engine nor the other clients ever
wait for it.

Replay: a client names a cursor (``since``, an event id) or a count (``replay``); the hub answers with the matching
events of the ring buffer *and* registers the client in the same synchronous step, so nothing falls between replay
and live and nothing is sent twice. An id the buffer does not hold (evicted, or from before a restart) is reported
as an unknown cursor and the whole buffer is replayed.

Shutdown: when the hub's task is cancelled, every client is told to close with 1001 ("going away") and the hub
waits, shielded and bounded, until they have; the HTTP server is stopped only after the sinks.

Reload: a hub replaced by a reload (its settings changed) hands its ring buffer (as much as the new ``bufferSize``
keeps), the events still in its channel and its counters to the new one (``take_over``), so its clients, closed with
1001, resume with ``since=`` on the new hub without a gap.

The websocket and HTTP routes are in ``nvdaemon/server/stream_routes.py``.
"""

from __future__ import annotations

import collections
import fnmatch
import logging
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, Metric
from nvdaemon.model import Event, Severity
from nvdaemon.queryparams import parse_count
from nvdaemon.shutdown import bounded_shield
from nvdaemon.sinks.base import BusSubscriber, ObservableDefaults, Sink, SinkContext
from nvdaemon.sinks.cloudevent import encode

log = logging.getLogger("nvdaemon.sinks.stream")  # the sink's name in log lines, as before it was a package

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TRY_AGAIN_LATER = 1013
SHUTDOWN_CLOSE_SECONDS = 2.0  # how long the hub waits, shielded, for its clients to close on shutdown


class FilterError(ValueError):
    """A query parameter that cannot be understood; the route answers 400 with this message."""


def _names(values: Iterable[str]) -> frozenset[str]:
    """Repeated parameters and comma-separated lists both work: ``?tier=core,gpu`` = ``?tier=core&tier=gpu``."""
    return frozenset(part.strip() for v in values for part in v.split(",") if part.strip())


def text_frame(payload: bytes) -> bytes:
    """``payload`` (UTF-8 text) as one websocket frame from a server: FIN, opcode 1 (text), no mask, the 7, 16 or
    64-bit payload length (RFC 6455 section 5.2). No extension is ever negotiated (``BoundedWSStream`` strips the
    offer), so the RSV bits are zero."""
    n = len(payload)
    if n < 126:
        head = bytes((0x81, n))
    elif n < 1 << 16:
        head = b"\x81\x7e" + n.to_bytes(2, "big")
    else:
        head = b"\x81\x7f" + n.to_bytes(8, "big")
    return head + payload


@dataclass(frozen=True, slots=True)
class Frame:
    """One message as it goes on the wire (``wire``: a complete text frame) and where its payload starts in it."""

    wire: bytes
    start: int

    @classmethod
    def of(cls, payload: bytes) -> Frame:
        wire = text_frame(payload)
        return cls(wire, len(wire) - len(payload))

    @property
    def payload(self) -> bytes:
        return self.wire[self.start :]

    @property
    def text(self) -> str:
        return self.wire[self.start :].decode()


@dataclass(frozen=True)
class Filters:
    """What a client wants: minimum severity, conditions, device globs, tiers. Empty means everything."""

    min_severity: Severity = Severity.INFO
    conditions: frozenset[str] = frozenset()
    devices: tuple[str, ...] = ()
    tiers: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        """No filter at all: every event matches (an unknown severity is never hidden, a known one is >= info)."""
        return self.min_severity <= Severity.INFO and not (self.conditions or self.devices or self.tiers)

    @classmethod
    def from_query(cls, args: Mapping[str, list[str]]) -> Filters:
        severity = Severity.INFO
        given = [v for v in args.get("severity", []) if v]
        if given:
            try:
                severity = Severity.parse(given[-1])
            except KeyError:
                raise FilterError("severity: expected info, warning or critical") from None
        return cls(
            min_severity=severity,
            conditions=_names(args.get("condition", [])),
            devices=tuple(sorted(_names(args.get("device", [])))),
            tiers=_names(args.get("tier", [])),
        )

    def match(self, ev: Event) -> bool:
        try:
            if Severity.parse(ev.severity) < self.min_severity:
                return False
        except KeyError:
            pass  # an unknown severity is never hidden
        if self.conditions and ev.condition not in self.conditions:
            return False
        if self.tiers and ev.tier not in self.tiers:
            return False
        return not self.devices or any(fnmatch.fnmatchcase(ev.device, g) for g in self.devices)


@dataclass(frozen=True)
class Cursor:
    """Where replay starts: after the event ``since``, or the last ``replay`` matching events; neither = live only."""

    since: str | None = None
    replay: int = 0

    @classmethod
    def from_query(cls, args: Mapping[str, list[str]], limit: int) -> Cursor:
        since = (args.get("since") or [""])[-1] or None
        text = (args.get("replay") or [""])[-1]
        if since is not None and text:
            raise FilterError("since and replay exclude each other")
        replay = 0
        if text:
            count = parse_count(text)
            if count is None:
                raise FilterError("replay: expected a count of events in ASCII digits (at most 9)")
            replay = min(count, limit)
        return cls(since=since, replay=replay)


@dataclass
class Replay:
    messages: list[Frame]
    unknown_cursor: bool = False
    oldest: str | None = None  # the oldest id the buffer holds, for the unknown-cursor control message

    def control(self, since: str | None) -> str | None:
        if not self.unknown_cursor:
            return None
        body = {
            "type": "control",
            "status": "unknown_cursor",
            "since": since,
            "oldest": self.oldest,
            "replaying": len(self.messages),
            "message": "the event id is not in the buffer (too old, or from before an agent restart); "
            "replaying every buffered event",
        }
        return msgspec.json.encode(body).decode()


@dataclass(eq=False)
class Client:
    """One live websocket client as the hub sees it. The route drains ``receive`` and closes with ``close_code``
    once ``kicked`` is set (by the hub: slow, or shutting down)."""

    filters: Filters
    send: trio.MemorySendChannel[Frame]
    receive: trio.MemoryReceiveChannel[Frame]
    everything: bool = False  # ``filters.everything``, read once per client instead of once per event
    close_code: int | None = None
    close_reason: str = ""
    kicked: trio.Event = field(default_factory=trio.Event)
    done: trio.Event = field(default_factory=trio.Event)

    def kick(self, code: int, reason: str) -> None:
        if self.close_code is None:
            self.close_code, self.close_reason = code, reason
        self.send.close()
        self.kicked.set()


class Refused(Exception):
    """The hub cannot take another client now (at ``maxClients``, or not running); the route answers 503."""


class StreamHub(BusSubscriber, ObservableDefaults):
    name = "stream"
    capacity = 4096  # bus backlog while the hub catches up; fan-out itself never waits

    def __init__(self, ctx: SinkContext) -> None:
        self.config = config = ctx.stream
        self._note_metrics = ctx.note_change
        self.buffer: collections.deque[tuple[Event, Frame]] = collections.deque(maxlen=config.buffer_size)
        self.clients: set[Client] = set()
        self.disconnects: collections.Counter[str] = collections.Counter()
        self.messages = 0  # event messages handed to clients (replay included)
        self.refused = 0
        self.running = False
        self._metrics_key: tuple[int, int, int] = (0, 0, 0)

    # ---- the sink protocols ---------------------------------------------------------------------------------
    def fingerprint(self) -> Hashable:
        c = self.config
        # pingSeconds too: the websocket routes take it from the running hub, so a reload that changes it must
        # replace the hub (its clients reconnect and resume from their cursor) or it would never take effect.
        return ("stream", c.buffer_size, c.max_clients, c.client_queue, c.ping_seconds)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.running = True
        task_status.started()
        try:
            async for event in self.events:
                self.publish(event)
                # Everything already waiting goes out before any client's sender runs: a burst of events reaches
                # each client's queue together and leaves in one socket write, not one wakeup and write per event.
                while True:
                    try:
                        self.publish(self.events.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                self._note_change()
        finally:
            self.running = False
            # Events the producers published before they stopped still reach the clients, then 1001.
            while True:
                try:
                    self.publish(self.events.receive_nowait())
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    break
            with bounded_shield(SHUTDOWN_CLOSE_SECONDS):
                await self.close_all(CLOSE_GOING_AWAY, "agent shutting down")

    def take_over(self, old: Sink) -> None:
        """Replacing ``old`` (before this hub's task starts, so it has no client yet): its ring buffer and the
        events its channel still holds (published after its own final drain) go into this one's buffer, oldest
        first; its counters carry on."""
        if not isinstance(old, StreamHub):
            return
        self.buffer.extend(old.buffer)  # this buffer's maxlen keeps the newest
        for event in old.leftovers():
            self.publish(event)
        self.disconnects.update(old.disconnects)
        self.messages += old.messages
        self.refused += old.refused
        self._note_change()

    def metrics(self) -> Iterable[Metric]:
        clients = GaugeMetricFamily("nodevitals_stream_clients", "Websocket clients connected to /v1/events.")
        clients.add_metric([], len(self.clients))
        disconnects = CounterMetricFamily(
            "nodevitals_stream_disconnects",
            "Websocket clients the server disconnected, by reason (slow: fell behind; full: refused at maxClients; "
            "shutdown: agent stopping).",
            labels=["reason"],
        )
        for reason in ("slow", "full", "shutdown"):
            disconnects.add_metric([reason], self.disconnects[reason])
        messages = CounterMetricFamily(
            "nodevitals_stream_messages", "Event messages handed to websocket clients, replay included."
        )
        messages.add_metric([], self.messages)
        return (clients, disconnects, messages)

    def state(self) -> dict[str, Any]:
        return {
            "clients": len(self.clients),
            "buffered": len(self.buffer),
            "bufferSize": self.config.buffer_size,
            "messages": self.messages,
            "disconnects": dict(self.disconnects),
        }

    # ---- fan-out --------------------------------------------------------------------------------------------
    def publish(self, event: Event) -> None:
        """Buffer one event and hand it to every matching client without waiting; drop clients that lag."""
        frame = Frame.of(encode(event, "structured")[1])
        self.buffer.append((event, frame))
        for client in list(self.clients):
            if not (client.everything or client.filters.match(event)):
                continue
            try:
                client.send.send_nowait(frame)
                self.messages += 1
            except trio.WouldBlock:
                self._drop(client, CLOSE_TRY_AGAIN_LATER, "client too slow", "slow")
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.clients.discard(client)

    def _drop(self, client: Client, code: int, reason: str, counted_as: str) -> None:
        self.clients.discard(client)
        self.disconnects[counted_as] += 1
        client.kick(code, reason)
        self._note_change()

    def _note_change(self) -> None:
        key = (len(self.clients), sum(self.disconnects.values()), self.messages)
        if key != self._metrics_key:
            self._metrics_key = key
            self._note_metrics()

    # ---- clients --------------------------------------------------------------------------------------------
    def snapshot(self, filters: Filters, cursor: Cursor) -> Replay:
        """The buffered events a cursor asks for, filtered."""
        items = list(self.buffer)
        oldest = items[0][0].id if items else None
        unknown = False
        if cursor.since is not None:
            start = next((i + 1 for i, (ev, _) in enumerate(items) if ev.id == cursor.since), None)
            if start is None:
                unknown, start = True, 0
            picked = [frame for ev, frame in items[start:] if filters.match(ev)]
        elif cursor.replay:
            picked = [frame for ev, frame in items if filters.match(ev)][-cursor.replay :]
        else:
            picked = []
        return Replay(picked, unknown_cursor=unknown, oldest=oldest)

    def connect(self, filters: Filters, cursor: Cursor) -> tuple[Client, Replay]:
        """Register a client and take its replay in one step (no event between them is lost or repeated)."""
        if not self.running:
            raise Refused("the stream hub is not running")
        if len(self.clients) >= self.config.max_clients:
            self.refused += 1
            self.disconnects["full"] += 1
            self._note_change()
            raise Refused(f"at most {self.config.max_clients} stream clients")
        send, receive = trio.open_memory_channel[Frame](self.config.client_queue)
        client = Client(filters, send, receive, everything=filters.everything)
        replay = self.snapshot(filters, cursor)
        self.messages += len(replay.messages)
        self.clients.add(client)
        self._note_change()
        return client, replay

    def disconnect(self, client: Client) -> None:
        """Called by the route when its connection ends, whoever ended it."""
        self.clients.discard(client)
        client.send.close()
        client.done.set()
        self._note_change()

    async def close_all(self, code: int, reason: str) -> None:
        clients = list(self.clients)
        for client in clients:
            self._drop(client, code, reason, "shutdown")
        for client in clients:
            await client.done.wait()
