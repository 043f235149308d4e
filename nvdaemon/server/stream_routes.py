"""``/v1/events``: the live event stream as a websocket, and the ring buffer as JSON without an upgrade.

Query parameters (both forms): ``severity`` (minimum: info, warning, critical), ``condition`` (names), ``device``
(globs), ``tier`` (names) — lists comma-separated or repeated; ``since=<event id>`` (the events after it) or
``replay=N`` (the last N matching events). A bad parameter is HTTP 400 before the upgrade; ``maxClients`` reached
is HTTP 503 before the upgrade. Messages the client sends are read and ignored; one larger than
``server.maxWebsocketMessageBytes`` (finished or not) closes the connection with 1009 (``nvdaemon/server/asgi.py``).
``replay`` is 1-9 ASCII digits (``queryparams.parse_count``). Besides events, the server sends
control messages: ``{"type":"control","status":"unknown_cursor",...}`` before a replay whose cursor it did not find,
and ``{"type":"ping"}`` every ``pingSeconds``.

Close codes: 1013 when the client fell more than ``clientQueue`` events behind, 1001 when the agent shuts down,
1009 for a message over the cap.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec
import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio

from nvdaemon.server import asgi
from nvdaemon.server.responses import json_response, query_lists
from nvdaemon.server.token import chosen_subprotocol
from nvdaemon.view import (
    STREAM_GOING_AWAY,
    StreamClient,
    StreamCursor,
    StreamFrame,
    StreamReplay,
    event_stream,
    stream_frame,
)

if TYPE_CHECKING:
    from nvdaemon.view import AgentView

CLOSE_SEND_SECONDS = 5.0  # a close frame that cannot be written in this long is given up (the kernel cuts the peer)
FLUSH_ON_SHUTDOWN_SECONDS = 1.0  # events still queued for a client when the agent stops get this long to go out
# An application-level keepalive. ASGI gives the application no way to send ping frames, and hypercorn's own ping
# task (websocket_ping_interval) outlives each connection by up to one interval, holding up the agent's shutdown.
PING = '{"type":"ping"}'
PING_FRAME = stream_frame(PING.encode())
Write = Callable[[list[StreamFrame]], Awaitable[None]]  # sends frames in order; see ``writer``


def register(app: QuartTrio, view: AgentView) -> None:
    @app.get("/v1/events")
    async def events_json() -> Response:
        h = event_stream(view)
        if h is None:
            return json_response({"error": "event stream disabled"}, 404)
        req = h.request(query_lists(request.args))
        if isinstance(req, str):
            return json_response({"error": "bad request", "detail": req}, 400)
        replay = h.recent(*req)
        head = msgspec.json.encode(
            {"status": "unknown_cursor" if replay.unknown_cursor else "ok", "oldest": replay.oldest}
        )
        body = head[:-1] + b',"events":[' + b",".join(f.payload for f in replay.messages) + b"]}"
        return Response(body, status=200, content_type="application/json")

    @app.websocket("/v1/events")
    async def events_ws() -> Response | None:
        h = event_stream(view)
        if h is None:
            return json_response({"error": "event stream disabled"}, 404)
        req = h.request(query_lists(websocket.args))
        if isinstance(req, str):
            return json_response({"error": "bad request", "detail": req}, 400)
        connected = h.connect(*req)
        if connected is None:
            return json_response({"error": "too many stream clients"}, 503)
        client, replay = connected
        try:
            await websocket.accept(subprotocol=chosen_subprotocol(websocket.requested_subprotocols))
            await _pump(client, replay, req[1], h.ping_seconds, writer())
            with trio.move_on_after(CLOSE_SEND_SECONDS):
                await websocket.close(client.close_code or STREAM_GOING_AWAY, client.close_reason)
        finally:
            h.disconnect(client)
        return None


async def _pump(
    client: StreamClient, replay: StreamReplay, cursor: StreamCursor, ping_seconds: float, write: Write
) -> None:
    """Send the replay, then live events and a ping every ``ping_seconds``, until the hub kicks this client (or the
    peer goes away: quart then cancels the handler). One task sends, so messages never interleave out of order;
    every frame already queued goes out with the one that woke it, in one ``write``."""
    sent_all = trio.Event()

    async def sender() -> None:
        next_ping = trio.current_time() + ping_seconds
        control = replay.control(cursor.since)
        first = [stream_frame(control.encode())] if control is not None else []
        first += replay.messages
        if first:
            await write(first)
        while True:
            try:
                batch = _queued(client.receive, [])  # a backlog goes out without a cancel scope per message
            except trio.EndOfChannel:
                break
            if batch:
                await write(batch)
                if trio.current_time() < next_ping:
                    continue
            # Only the wait is bounded by the ping deadline, never the send: a send cut short by it lost the event.
            got: StreamFrame | None = None
            with trio.move_on_at(next_ping):
                try:
                    got = await client.receive.receive()
                except trio.EndOfChannel:
                    break
            if got is not None:
                try:
                    batch = _queued(client.receive, [got])
                except trio.EndOfChannel:
                    batch = [got]
                await write(batch)
                continue
            next_ping += ping_seconds
            await write([PING_FRAME])
        sent_all.set()

    async def ignore_incoming() -> None:
        while True:
            await websocket.receive()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        nursery.start_soon(ignore_incoming)
        await client.kicked.wait()
        if client.close_code == STREAM_GOING_AWAY:
            with trio.move_on_after(FLUSH_ON_SHUTDOWN_SECONDS):
                await sent_all.wait()
        nursery.cancel_scope.cancel()


def _queued(receive: trio.MemoryReceiveChannel[StreamFrame], batch: list[StreamFrame]) -> list[StreamFrame]:
    """``batch`` plus every frame queued now (at most ``clientQueue``). EndOfChannel only when nothing was taken."""
    while True:
        try:
            batch.append(receive.receive_nowait())
        except trio.WouldBlock:
            return batch
        except trio.EndOfChannel:
            if batch:
                return batch
            raise


def writer() -> Write:
    """How this connection's frames are sent: written as they are, several at once, under the agent's hypercorn
    (``asgi.frame_writer``); else one ASGI text message each."""
    raw = asgi.frame_writer()
    if raw is not None:
        write_raw = raw

        async def write(batch: list[StreamFrame]) -> None:
            await write_raw(batch[0].wire if len(batch) == 1 else b"".join(f.wire for f in batch))

    else:

        async def write(batch: list[StreamFrame]) -> None:
            for frame in batch:
                await websocket.send(frame.text)

    return write
