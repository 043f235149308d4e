"""A receiver's answer is read through a byte limit and never inflated: a real HTTP server on loopback answers with
a body far larger than the limit and with a gzip bomb. The outcome is the status's, the agent reads at most about
the limit (counted at the transport, under any decoding), decompresses nothing, and a connection whose answer was
left unread is closed, not reused. Real time, small backoffs (as in test_webhook_http)."""

from __future__ import annotations

import contextlib
import gzip
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from .helpers import event, hook, running, until

HUGE = 32 * 1024 * 1024  # the body a misbehaving receiver sends (the was 100 MB)
BOMB_INFLATED = 16 * 1024 * 1024  # a gzip bomb: this many zero bytes, ~16 KB on the wire
LIMIT = 64 * 1024  # the documented answer limit
READ_BOUND = LIMIT + 64 * 1024  # the limit plus one read of the transport


class Receiver:
    """Answers each POST with the next scripted answer: ``("huge", status, headers)``, ``("bomb",)`` or ``("ok",)``
    (200, ``ok``, the default). Records each request's client port and Accept-Encoding, and the body bytes it got
    out to the agent for each huge answer before the agent closed the connection."""

    def __init__(self) -> None:
        self.script: list[tuple[Any, ...]] = []
        self.requests: list[tuple[int, str | None]] = []
        self.sent: list[int] = []
        self.lock = threading.Lock()
        self.bomb = gzip.compress(bytes(BOMB_INFLATED), compresslevel=9)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    receiver.requests.append((self.client_address[1], self.headers.get("accept-encoding")))
                    answer = receiver.script.pop(0) if receiver.script else ("ok",)
                if answer[0] == "huge":
                    self.send_response(answer[1])
                    for k, v in answer[2].items():
                        self.send_header(k, v)
                    self.send_header("content-length", str(HUGE))
                    self.end_headers()
                    sent, block = 0, bytes(1024 * 1024)
                    try:
                        while sent < HUGE:
                            self.wfile.write(block)
                            sent += len(block)
                    except OSError:  # the agent closed the connection: what it did not want is never sent
                        self.close_connection = True
                    with receiver.lock:
                        receiver.sent.append(sent)
                    return
                body = receiver.bomb if answer[0] == "bomb" else b"ok"
                self.send_response(200)
                if answer[0] == "bomb":
                    self.send_header("content-encoding", "gzip")  # whatever the agent said it accepts
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class Counted(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, counts: list[int]) -> None:
        self.inner, self.counts = inner, counts
        counts.append(0)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.counts[-1] += len(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class CountingTransport(httpx.AsyncBaseTransport):
    """The real transport, counting the body bytes of each answer as they come off the connection."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.read: list[int] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(request)
        assert isinstance(resp.stream, httpx.AsyncByteStream)
        resp.stream = Counted(resp.stream, self.read)
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture
def inflated(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Bytes any gzip decoder of httpx produced in this test."""
    out: list[int] = []
    real = httpx._decoders.GZipDecoder.decode

    def decode(self: Any, data: bytes) -> bytes:
        result = real(self, data)
        out.append(len(result))
        return result

    monkeypatch.setattr(httpx._decoders.GZipDecoder, "decode", decode)
    yield out


async def test_a_huge_answer_is_not_read_and_its_connection_is_closed(tmp_path: Path) -> None:
    transport = CountingTransport()
    with Receiver() as rx:
        rx.script = [("huge", 503, {"retry-after": "0"}), ("huge", 200, {}), ("ok",), ("ok",)]
        async with running(tmp_path, hook(rx.url), transport=transport) as (sink, bus):
            for i in range(3):
                bus.publish(event(i))
            await until(lambda: sink.attempts.get("success") == 3)
            assert sink.attempts == {"retryable": 1, "success": 3}  # outcomes by status, as before
            assert sink.backlog == 0 and sink.dropped_counts() == {}
            # The receiver's handler threads note a huge answer once their write to the closed connection failed.
            await until(lambda: len(rx.sent) == 2, lambda: f"the receiver's two huge answers cut: {rx.sent}")
    assert len(transport.read) == 4
    assert max(transport.read[:2]) <= READ_BOUND, transport.read  # not HUGE
    assert len(rx.sent) == 2 and max(rx.sent) < HUGE  # the receiver's writes failed: the agent had closed
    ports = [port for port, _ in rx.requests]
    # Each huge answer's connection was closed, never handed back to the pool; short answers keep theirs alive.
    assert ports[0] != ports[1] != ports[2] and ports[2] == ports[3], ports


async def test_a_gzip_bomb_is_never_inflated(tmp_path: Path, inflated: list[int]) -> None:
    transport = CountingTransport()
    with Receiver() as rx:
        rx.script = [("bomb",), ("bomb",)]
        async with running(tmp_path, hook(rx.url), transport=transport) as (sink, bus):
            bus.publish(event(1))
            bus.publish(event(2))
            await until(lambda: sink.attempts.get("success") == 2)
    assert sum(inflated) == 0  # not BOMB_INFLATED
    assert transport.read == [len(rx.bomb)] * 2 and len(rx.bomb) <= LIMIT
    assert all(enc == "identity" for _, enc in rx.requests), rx.requests
    assert rx.requests[0][0] == rx.requests[1][0]  # read to its end (raw): the connection stays reusable


async def test_a_body_cut_off_after_the_status_keeps_the_status(tmp_path: Path) -> None:
    """200 and then the connection dies mid-body: delivered (the receiver said so), and the next request works."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        served: list[int] = []

        def serve() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = listener.accept()
                    with conn:
                        data = b""
                        while b"\r\n\r\n" not in data:
                            data += conn.recv(65536)
                        head, _, rest = data.partition(b"\r\n\r\n")
                        fields = dict(h.lower().split(b": ", 1) for h in head.split(b"\r\n")[1:])
                        length = int(fields[b"content-length"])
                        while len(rest) < length:
                            rest += conn.recv(65536)
                        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\npartial")
                        served.append(1)

        threading.Thread(target=serve, daemon=True).start()
        async with running(tmp_path, hook(f"http://127.0.0.1:{port}/hooks")) as (sink, bus):
            bus.publish(event(1))
            bus.publish(event(2))
            await until(lambda: sink.attempts.get("success") == 2)
            assert sink.attempts == {"success": 2} and len(served) == 2
