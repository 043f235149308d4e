"""Each event is encoded once for every client: one CloudEvent encode and one websocket frame per event, whatever
the number of clients, and those bytes are what every client receives (a real server, real trio-websocket clients).
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
import trio
from wsproto.frame_protocol import FrameProtocol

from nvdaemon.sinks import cloudevent
from nvdaemon.sinks.stream import hub as stream
from tests.stream.harness import make_event, receive, running

CLIENTS = 5
EVENTS = 12


def test_text_frame_is_what_wsproto_sends_as_a_server() -> None:
    proto = FrameProtocol(client=False, extensions=[])
    for size in (0, 1, 125, 126, 127, 65535, 65536, 70000):
        payload = b"x" * size
        assert stream.text_frame(payload) == proto.send_data(payload.decode(), fin=True), size
        frame = stream.Frame.of(payload)
        assert frame.payload == payload and frame.text == payload.decode()


async def test_n_clients_cost_one_encode_and_one_frame_per_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: collections.Counter[str] = collections.Counter()

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kw)

        return wrapper

    monkeypatch.setattr(stream, "encode", counted("cloudevent", cloudevent.encode))
    monkeypatch.setattr(stream, "text_frame", counted("frame", stream.text_frame))
    # What each client's wsproto connection does for a message sent through ASGI: frame it for that client.
    monkeypatch.setattr(FrameProtocol, "send_data", counted("per_client_frame", FrameProtocol.send_data))
    async with running(tmp_path, stream="{pingSeconds: 3600}") as srv, trio.open_nursery() as nursery:
        conns = [await nursery.start(_connect, srv) for _ in range(CLIENTS)]
        while len(srv.hub.clients) < CLIENTS:
            await trio.sleep(0.01)
        calls.clear()
        events = [make_event(i, device=f"gpu{i % 3}") for i in range(EVENTS)]
        await srv.publish(events)
        for ws in conns:
            got = await receive(ws, EVENTS)
            assert [d["id"] for d in got] == [e.id for e in events]
        nursery.cancel_scope.cancel()
    assert calls["cloudevent"] == EVENTS
    assert calls["frame"] == EVENTS
    assert calls["per_client_frame"] == 0
    assert srv.hub.messages == CLIENTS * EVENTS


async def _connect(srv: Any, task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    async with srv.connect() as ws:
        task_status.started(ws)
        await trio.sleep_forever()
