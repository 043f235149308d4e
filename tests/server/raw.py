"""A real server in process on 127.0.0.1:0 and a raw HTTP/1.1 client over trio sockets, for what a library client
hides: keep-alive, half-sent heads, connections that are closed or never answered."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.server.app import serve_http
from nvdaemon.supervise import Supervisor


def make_agent(tmp_path: Path, server: str = "{}", extra: str = "") -> Agent:
    text = (
        f"node: n1\nstateDir: {tmp_path / 'state'}\nintervalSeconds: 10\n"
        f"sinks: {{metrics: {{listenAddr: '127.0.0.1:0'}}}}\nserver: {server}\n{extra}"
    )
    return Agent(parse_config(text, "test.yaml", env={}))


@asynccontextmanager
async def serving(agent: Agent) -> AsyncIterator[tuple[str, int]]:
    """``agent``'s HTTP server under a supervisor; (host, port) of its listener; stopped gracefully on exit."""
    async with trio.open_nursery() as nursery:
        agent.supervisor = sup = Supervisor(nursery)
        await sup.start("http", serve_http, agent, critical=True, fingerprint=agent.server_fingerprint())
        host, _, port = agent.bound[0].removeprefix("http://").rpartition(":")
        try:
            yield host, int(port)
        finally:
            sup.stopping = True
            agent.http_shutdown.set()
            await sup.tasks["http"].done.wait()
            nursery.cancel_scope.cancel()


class Conn:
    """One TCP connection; reads responses with a Content-Length (all of ours have one)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buf = b""

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        return cls(await trio.open_tcp_stream(host, port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def get(self, path: str, headers: str = "", version: str = "1.1") -> tuple[int, dict[str, str], bytes]:
        await self.send(f"GET {path} HTTP/{version}\r\nHost: x\r\n{headers}\r\n".encode())
        return await self.response()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            chunk = await self.stream.receive_some()
            assert chunk, f"connection closed before a response head; got {self.buf!r}"
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        length = int(headers.get("content-length", "0"))
        while len(self.buf) < length:
            chunk = await self.stream.receive_some()
            assert chunk, "connection closed inside a response body"
            self.buf += chunk
        body, self.buf = self.buf[:length], self.buf[length:]
        return int(status_line.split()[1]), headers, body

    async def closed_by_server(self) -> bytes:
        """Everything the server still sends until it closes the connection (raises TooSlowError via the caller's
        deadline when it never does)."""
        rest = self.buf
        try:
            while chunk := await self.stream.receive_some():
                rest += chunk
        except trio.BrokenResourceError:  # reset rather than FIN: closed all the same
            pass
        return rest

    async def aclose(self) -> None:
        await self.stream.aclose()
