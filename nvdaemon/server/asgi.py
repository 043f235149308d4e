"""Two corrections to how hypercorn (0.17-0.18, trio worker) and quart-trio behave together, at the smallest depth
that fixes each.

**The idle timer and ``Connection: close``** (``shield_final_send``). Hypercorn does its per-connection bookkeeping
inside the application's last ``send`` (the ``http.response.body`` with ``more_body`` false), in the app's task:
``HTTPStream._send_closed`` -> ``H11Protocol._maybe_recycle``, which first hands the app ``http.disconnect``, then
either starts the next keep-alive cycle and restarts the idle timer (``TCPServer.idle_task.restart``, which is what
closes an idle connection after ``keep_alive_timeout`` and cuts a client that dribbles the *next* request's
headers), or, when either side said ``Connection: close``, closes the socket. quart-trio's per-request nursery
cancels itself as soon as its ``handle_messages`` task receives that ``http.disconnect``; the cancellation lands at
the next checkpoint of the same ``send`` (the idle timer's lock, or ``send_eof``), so the timer was never restarted
and the close never happened: after one request a connection lived for ever. Shielding that one final ``send``
lets hypercorn finish; it cannot hang, because the only blocking part, writing to the socket, is already shielded by
hypercorn and bounded by TCP_USER_TIMEOUT (``nvdaemon/server/listen.py``).

**Inbound websocket messages** (``BoundedWSStream``). Hypercorn enforces ``websocket_max_message_size`` in
``WebsocketBuffer.extend``, *after* appending each fragment, and after sending close 1009 it keeps the connection,
the running app and the buffer: a client that keeps sending fragments grows it without bound. The subclass tears
the connection down right after the 1009 and drops the buffer, so at most the cap plus one socket read (64 KiB) is
ever held. It also removes ``Sec-WebSocket-Extensions`` from the handshake: permessage-deflate would inflate a small
compressed frame into megabytes before any size check, and the stream's small JSON messages do not need it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import hypercorn.protocol.h2
import hypercorn.protocol.h11
import trio
from hypercorn.protocol.events import Event, Request, StreamClosed
from hypercorn.protocol.ws_stream import WSStream

ASGIApp = Any  # an ASGI 3 callable: (scope, receive, send) -> None


def shield_final_send(app: ASGIApp) -> ASGIApp:
    """``app`` with the last ``send`` of every HTTP response shielded from the request's own cancellation."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_final_shielded(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await app(scope, receive, send_final_shielded)

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


def install() -> None:
    """Make hypercorn's HTTP/1.1 and HTTP/2 protocols create ``BoundedWSStream`` for websocket upgrades. Idempotent;
    hypercorn offers no hook for its stream class, so the module attribute it looks the class up by is replaced."""
    for module in (hypercorn.protocol.h11, hypercorn.protocol.h2):
        setattr(module, "WSStream", BoundedWSStream)  # noqa: B010 (not a re-export mypy should see)
