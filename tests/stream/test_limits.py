"""What a hostile /v1/events client can do: send messages larger than the protocol needs (a finished one, or an
unfinished fragmented one that would otherwise be buffered for ever), or a query the parser must refuse cleanly."""

from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path

import httpx
import pytest
import trio
import trio_websocket

from tests.polling import until
from tests.stream.harness import Server, make_event, receive, running

CAP = 4096


def frame(opcode: int, payload: bytes, *, fin: bool) -> bytes:
    """A client frame; masked (as RFC 6455 requires) with an all-zero key, so the payload goes out as is."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack("!H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", n)
    return head + b"\0\0\0\0" + payload


async def upgrade(srv: Server) -> trio.SocketStream:
    stream = await trio.open_tcp_stream(srv.host, srv.port)
    key = base64.b64encode(os.urandom(16)).decode()
    await stream.send_all(
        f"GET /v1/events HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += await stream.receive_some()
    assert head.startswith(b"HTTP/1.1 101"), head
    assert b"permessage-deflate" not in head.lower()  # a compressed frame could inflate past any cap unchecked
    return stream


async def flood_unfinished(stream: trio.SocketStream, total: int, chunk: int = 64 * 1024) -> int:
    """Send ``total`` bytes of one text message that never finishes (FIN never set); stop when the server has
    closed. Returns the bytes sent."""
    sent = 0
    try:
        await stream.send_all(frame(0x1, b"a" * chunk, fin=False))
        sent = chunk
        while sent < total:
            await stream.send_all(frame(0x0, b"a" * chunk, fin=False))
            sent += chunk
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    return sent


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    data = b""
    try:
        while chunk := await stream.receive_some():
            data += chunk
    except trio.BrokenResourceError:  # reset: the server closed with our data unread
        pass
    return data


def close_code(data: bytes) -> int:
    """The close code of the close frame among the server's (unmasked) frames."""
    at = 0
    while at + 2 <= len(data):
        opcode, n = data[at] & 0x0F, data[at + 1] & 0x7F
        at += 2
        if n == 126:
            n, at = struct.unpack("!H", data[at : at + 2])[0], at + 2
        elif n == 127:
            n, at = struct.unpack("!Q", data[at : at + 8])[0], at + 8
        if opcode == 0x8:
            code: int = struct.unpack("!H", data[at : at + 2])[0]
            return code
        at += n
    raise AssertionError(f"no close frame in {data[:200]!r}")


async def test_unfinished_fragmented_messages_are_cut_off_with_1009(tmp_path: Path) -> None:
    """The issue's 60 clients x 15 MB at a smaller scale: each client streams 2 MB of one message that never ends
    and never answers the close. Each is sent 1009 and disconnected, none is kept as a stream client, and the
    server keeps serving."""
    async with running(tmp_path) as srv:
        outcomes: list[tuple[int, bytes]] = []

        async def hostile() -> None:
            stream = await upgrade(srv)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood_unfinished, stream, 2 * 1024 * 1024)
                outcomes.append((0, await read_until_closed(stream)))
                nursery.cancel_scope.cancel()
            await stream.aclose()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(hostile)
        assert len(outcomes) == 5
        assert all(close_code(data) == 1009 for _, data in outcomes)
        await until(lambda: not srv.hub.clients, "the hostile clients gone from the hub", timeout=10, step=0.05)
        await srv.publish([make_event(1)])
        async with srv.connect(replay=1) as ws:
            assert (await receive(ws, 1))[0]["data"]["seq"] == 1


async def test_finished_message_over_the_cap_closes_with_1009_and_small_ones_are_ignored(tmp_path: Path) -> None:
    extra = f"server: {{maxWebsocketMessageBytes: {CAP}}}\n"
    async with running(tmp_path, extra=extra) as srv, srv.connect() as ws:
        await ws.send_message("x" * CAP)  # at the cap: read and ignored
        await srv.publish([make_event(2)])
        assert (await receive(ws, 1))[0]["data"]["seq"] == 2
        await ws.send_message("x" * (CAP + 1))
        with trio.fail_after(10), pytest.raises(trio_websocket.ConnectionClosed) as closed:
            while True:
                await ws.get_message()
        assert closed.value.reason is not None and closed.value.reason.code == 1009


@pytest.mark.parametrize("replay", ["³", "١٢", "+1", " 1", "1e3", "0x10", "1" * 10, "-1", "1.0"])
async def test_replay_accepts_ascii_digits_only(tmp_path: Path, replay: str) -> None:
    async with running(tmp_path) as srv:
        async with httpx.AsyncClient(base_url=f"http://{srv.host}:{srv.port}") as http:
            resp = await http.get("/v1/events", params={"replay": replay})
            assert resp.status_code == 400
            assert resp.headers["content-type"] == "application/json"
            assert "replay" in resp.json()["detail"]
            assert (await http.get("/v1/events", params={"replay": "007"})).status_code == 200
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with srv.connect(replay=replay):
                pass
        assert rejected.value.status_code == 400
        assert "replay" in json.loads(rejected.value.body or b"{}")["detail"]
