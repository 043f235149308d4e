"""What sits between hypercorn (0.17-0.18, trio worker) and the quart-trio app: the probes' fast path, a bound on
requests worked on at once, and corrections to how hypercorn behaves, alone and with quart-trio.

**Probes first** (``front``). Under load every request waits, at each of its task switches (accept, the connection
task, its read, the app task, quart's two tasks per request), for one pass of trio's scheduler over every other
runnable task; with 500 keep-alive clients hammering /metrics a pass was several hundred ms and /healthz took 4 s.
So ``/healthz`` and ``/readyz`` are answered in the app task, before quart (fewer switches), and every other HTTP
request first takes one of ``WORK_SLOTS`` slots until its response starts: the rest wait parked (no cost to a
pass), a pass stays short, and a probe gets through within a few short passes. The slot is released when the
response starts, so a client that reads slowly cannot hold one (its send is bounded by TCP_USER_TIMEOUT).

**The idle timer and ``Connection: close``** (the final send is shielded). Hypercorn does its per-connection bookkeeping
inside the application's last ``send`` (the ``http.response.body`` with ``more_body`` false), in the app's task:
``HTTPStream._send_closed`` -> ``H11Protocol._maybe_recycle``, which first hands the app ``http.disconnect``, then
either starts the next keep-alive cycle and restarts the idle timer (``TCPServer.idle_task.restart``, which is what
closes an idle connection after ``keep_alive_timeout`` and cuts a client that dribbles the *next* request's
headers), or, when either side said ``Connection: close``, closes the socket. quart-trio's per-request nursery
cancels itself as soon as its ``handle_messages`` task receives that ``http.disconnect``; the cancellation lands at
the next checkpoint of the same ``send`` (the idle timer's lock, or ``send_eof``), so the timer was never restarted
and the close never happened: after one request a connection lived for ever. Shielding that one final ``send``
lets hypercorn finish; it cannot hang, because the only blocking part, writing to the socket, is already shielded by
hypercorn and bounded by TCP_USER_TIMEOUT (``nvdaemon/server/listen.py``), and on a stop by the graceful timeout,
after which the connection is closed under it (``nvdaemon/server/accept.py``).

**HTTP/1.1 only** (``Http11Only``). On a plaintext connection hypercorn switches to HTTP/2 when a client sends the
prior-knowledge preface or ``Upgrade: h2c``; an HTTP/2 connection runs up to 100 requests at once with 64 KiB
heads, which the bounds here (one request per connection under the connection cap, 16 KiB heads) do not cover, and
the Go agent's server speaks HTTP/1.1 only. Hypercorn asks the protocol's ``_check_protocol`` whether to switch;
the subclass never does.

**Inbound websocket messages** (``BoundedWSStream``). Hypercorn enforces ``websocket_max_message_size`` in
``WebsocketBuffer.extend``, *after* appending each fragment, and after sending close 1009 it keeps the connection,
the running app and the buffer: a client that keeps sending fragments grows it without bound. The subclass tears
the connection down right after the 1009 and drops the buffer, so at most the cap plus one socket read (64 KiB) is
ever held. It also removes ``Sec-WebSocket-Extensions`` from the handshake: permessage-deflate would inflate a small
compressed frame into megabytes before any size check, and the stream's small JSON messages do not need it.

**Pre-encoded frames** (``write_frames``). ``/v1/events`` sends the same event to up to ``maxClients`` clients;
through ASGI every client's message would be framed by its own wsproto connection and written on its own. The
stream route instead hands complete frames, built once per event (``nvdaemon.sinks.stream.hub.Frame``), to
``write_frames``, which writes them as they are, several in one socket write. ``front`` makes it available to the
websocket handler's context (``frame_writer``). Valid because no extension is negotiated (no RSV bits, no deflate)
and a server's frames are unmasked; once the connection is closing they are dropped, as hypercorn drops a message.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import hypercorn.protocol.h2
import hypercorn.protocol.h11
import trio
from hypercorn.protocol.events import Data, Event, Request, StreamClosed
from hypercorn.protocol.ws_stream import ASGIWebsocketState, WSStream
from wsproto.connection import ConnectionState

ASGIApp = Any  # an ASGI 3 callable: (scope, receive, send) -> None


WORK_SLOTS = 16  # HTTP requests (other than the probes) between arrival and the start of their response
Probe = Callable[[str], "tuple[int, bytes] | None"]  # path -> (status, JSON body); None: not a probe path
# A GET answered without quart: its raw request headers -> (response headers but the length, body); /metrics
# reads Accept-Encoding there.
Page = Callable[[list[tuple[bytes, bytes]]], tuple[list[tuple[bytes, bytes]], bytes]]

FrameWriter = Callable[[bytes], Awaitable[None]]  # complete websocket frames -> the connection's socket
_FRAME_WRITER: contextvars.ContextVar[FrameWriter | None] = contextvars.ContextVar("frame_writer", default=None)


def frame_writer() -> FrameWriter | None:
    """The websocket connection's ``BoundedWSStream.write_frames``, in the task of its handler (None elsewhere, or
    under another server)."""
    return _FRAME_WRITER.get()


def front(app: ASGIApp, probe: Probe, pages: Mapping[str, Page] | None = None) -> ASGIApp:
    """``app`` behind the probes' fast path and the work slots, with the last ``send`` of every HTTP response
    shielded from the request's own cancellation. ``pages``: paths whose GET is answered here, under a work slot,
    without quart (``/metrics``: quart's request and response objects were a third of a cached scrape's CPU)."""
    slots = trio.Semaphore(WORK_SLOTS)
    direct = dict(pages or {})

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            stream = getattr(send, "__self__", None)  # hypercorn hands the app its stream's bound app_send
            if isinstance(stream, BoundedWSStream):
                _FRAME_WRITER.set(stream.write_frames)  # this task's own context, copied into quart's handler
            await app(scope, receive, send)
            return
        if scope["method"] in ("GET", "HEAD") and (answer := probe(scope["path"])) is not None:
            status, body = answer
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": headers})
            with trio.CancelScope(shield=True):
                await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        holding = False

        def release() -> None:
            nonlocal holding
            if holding:
                holding = False
                slots.release()

        async def send_guarded(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                release()
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await slots.acquire()
        holding = True
        try:
            if scope["method"] == "GET" and (page := direct.get(scope["path"])) is not None:
                headers, body = page(scope["headers"])
                headers = [*headers, (b"content-length", str(len(body)).encode())]
                await send_guarded({"type": "http.response.start", "status": 200, "headers": headers})
                await send_guarded({"type": "http.response.body", "body": body, "more_body": False})
                return
            await app(scope, receive, send_guarded)
        finally:
            release()

    return wrapped


class BoundedWSStream(WSStream):
    async def handle(self, event: Event) -> None:
        if isinstance(event, Request):
            headers = [(k, v) for k, v in event.headers if k.lower() != b"sec-websocket-extensions"]
            event = dataclasses.replace(event, headers=headers)
        await super().handle(event)

    async def _handle_events(self) -> None:
        await super()._handle_events()
        if self.buffer.length > self.buffer.max_length and not self.closed:
            # hypercorn has just queued close 1009 (MESSAGE_TOO_BIG); end the connection instead of reading on.
            self.buffer.clear()
            await self.send(StreamClosed(stream_id=self.stream_id))

    async def write_frames(self, frames: bytes) -> None:
        """Complete, unmasked, extension-free frames (one or more) to the socket, in one write."""
        if self.closed or self.state != ASGIWebsocketState.CONNECTED:
            return
        if self.connection.state is not ConnectionState.OPEN:
            return
        await self.send(Data(stream_id=self.stream_id, data=frames))


class Http11Only(hypercorn.protocol.h11.H11Protocol):
    async def _check_protocol(self, event: Any) -> None:
        """Never switch to HTTP/2: ``Upgrade: h2c`` is ignored and the prior-knowledge preface is an HTTP/1.1 request
        like any other (an error answer)."""


def install() -> None:
    """Make hypercorn speak HTTP/1.1 only (``Http11Only``) and create ``BoundedWSStream`` for websocket upgrades.
    Idempotent; hypercorn offers no hook for its protocol or stream classes, so the module attributes it looks
    them up by are replaced."""
    setattr(hypercorn.protocol, "H11Protocol", Http11Only)  # noqa: B010 (not a re-export mypy should see)
    for module in (hypercorn.protocol.h11, hypercorn.protocol.h2):
        setattr(module, "WSStream", BoundedWSStream)  # noqa: B010
