"""The websocket sender on its own, with a peer slower than the ping interval (mock clock, no network)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from nvdaemon.server import stream_routes
from nvdaemon.sinks.stream.hub import Frame


class SlowPeer:
    """A websocket whose every send takes 5 s: a slow reader behind a full socket buffer."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, text: str) -> None:
        await trio.sleep(5)
        self.sent.append(text)

    async def receive(self) -> Any:
        await trio.sleep_forever()


async def test_a_send_outlasting_the_ping_deadline_still_delivers_the_event(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    peer = SlowPeer()
    monkeypatch.setattr(stream_routes, "websocket", peer)
    events, receive = trio.open_memory_channel[Frame](10)
    client: Any = SimpleNamespace(receive=receive, kicked=trio.Event(), close_code=None)
    replay: Any = SimpleNamespace(control=lambda since: None, messages=[])
    cursor: Any = SimpleNamespace(since=None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream_routes._pump, client, replay, cursor, 1.0, stream_routes.writer())
        await trio.sleep(0.5)
        # received before the 1 s ping deadline, sent across it
        await events.send(Frame.of(b'{"id":"e1"}'))
        await events.send(Frame.of(b'{"id":"e2"}'))
        await trio.sleep(30)
        client.kicked.set()
    assert [m for m in peer.sent if m != stream_routes.PING] == ['{"id":"e1"}', '{"id":"e2"}']
