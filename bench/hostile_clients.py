"""Seconds from SIGTERM to exit with ``shutdownGraceSeconds: 2`` while HTTP_CLIENTS keep-alive clients hammer
``/metrics`` (each asks again as soon as its answer is complete) and WS_CLIENTS clients hold ``/v1/events`` open
(issue 26: 2.64 s). The agent: ``nvdaemon run``, the core tier on ``fixtures/hosts/faulty``, the stream sink on,
idle and header timeouts long enough that nothing is closed before the signal. The clients: plain sockets in one
selector loop in this process, busy for a second before the signal and until the agent is gone.

Figures: ``exit_s`` (signal to the process reaped), ``left_open`` (clients that saw no end of their connection
within 0.5 s of the exit), ``http_closed_before_exit``, ``ws_no_1001`` (websocket clients that got no close frame
with code 1001 before their connection ended), and the /metrics answers in the second before the signal.
"""

from __future__ import annotations

import base64
import contextlib
import os
import selectors
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import AgentProcess, BenchError, copy_host

HTTP_CLIENTS = 500
WS_CLIENTS = 50
GRACE = 2.0
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n"


@dataclass
class Client:
    sock: socket.socket
    websocket: bool
    buf: bytes = b""
    answers: int = 0
    close_code: int | None = None
    ended_at: float | None = None  # seconds after the signal (negative: before it)

    def feed(self) -> bool:
        """Consume complete answers (HTTP) or frames (websocket) from ``buf``; True when an HTTP answer completed."""
        done = False
        while True:
            if self.websocket:
                if not self._frame():
                    return False
                continue
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if not sep:
                return done
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return done
            self.buf, self.answers, done = rest[length:], self.answers + 1, True

    def _frame(self) -> bool:
        """One server frame (never masked) off ``buf``; a close frame's code is kept. False when incomplete."""
        if len(self.buf) < 2:
            return False
        opcode, size, at = self.buf[0] & 0x0F, self.buf[1] & 0x7F, 2
        if size >= 126:
            width = 2 if size == 126 else 8
            if len(self.buf) < 2 + width:
                return False
            size, at = int.from_bytes(self.buf[2 : 2 + width], "big"), 2 + width
        if len(self.buf) < at + size:
            return False
        if opcode == 8 and size >= 2:
            self.close_code = int.from_bytes(self.buf[at : at + 2], "big")
        self.buf = self.buf[at + size :]
        return True


def _connect(port: int, websocket: bool) -> Client:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    client = Client(sock, websocket)
    if websocket:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(
            f"GET /v1/events HTTP/1.1\r\nHost: bench\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        while b"\r\n\r\n" not in client.buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise BenchError("a websocket client was closed during its handshake")
            client.buf += chunk
        head, _, client.buf = client.buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise BenchError(f"websocket handshake refused: {head.splitlines()[0]!r}")
    else:
        sock.sendall(REQUEST)
        while not client.feed():
            chunk = sock.recv(65536)
            if not chunk:
                raise BenchError("a /metrics client was closed before its first answer")
            client.buf += chunk
    sock.setblocking(False)
    return client


def _pump(sel: selectors.BaseSelector, until: Callable[[], bool], signalled: list[float]) -> None:
    """Read every client (asking busy HTTP clients again) until ``until()``; notes when each connection ended."""
    while not until():
        for key, _ in sel.select(0.01):
            client: Client = key.data
            try:
                data = client.sock.recv(262144)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                sel.unregister(client.sock)
                client.ended_at = time.monotonic() - signalled[0] if signalled else -1.0
                continue
            client.buf += data
            if client.feed() and not client.websocket:
                with contextlib.suppress(OSError):  # the agent closed it: the next read sees the end
                    client.sock.send(REQUEST)


def shutdown_under_clients() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="nvdaemon-hostile-") as tmp:
        config: dict[str, Any] = {
            "node": "bench-node",
            "tiers": ["core"],
            "intervalSeconds": 1,
            "shutdownGraceSeconds": GRACE,
            "sinks": {"stream": {"enabled": True, "maxClients": 1000}},
            "server": {"idleTimeoutSeconds": 300, "headerTimeoutSeconds": 300},
        }
        with AgentProcess(config, copy_host("faulty", Path(tmp))) as agent:
            assert agent.proc is not None
            proc = agent.proc
            clients = [_connect(agent.port, False) for _ in range(HTTP_CLIENTS)]
            clients += [_connect(agent.port, True) for _ in range(WS_CLIENTS)]
            sel = selectors.DefaultSelector()
            try:
                for c in clients:
                    sel.register(c.sock, selectors.EVENT_READ, c)
                    if not c.websocket:
                        c.sock.send(REQUEST)
                signalled: list[float] = []
                start = time.monotonic()
                _pump(sel, lambda: time.monotonic() > start + 1.0, signalled)
                answers_before = sum(c.answers for c in clients)
                exited: list[float] = []
                signalled.append(time.monotonic())
                proc.send_signal(signal.SIGTERM)

                def reap() -> None:
                    proc.wait()
                    exited.append(time.monotonic())

                waiter = threading.Thread(target=reap, daemon=True)
                waiter.start()
                limit = signalled[0] + GRACE + 30

                def done() -> bool:
                    now = time.monotonic()
                    return now > limit or (bool(exited) and now > exited[0] + 0.5) or not sel.get_map()

                _pump(sel, done, signalled)
                waiter.join(GRACE + 30)
                if not exited:
                    raise BenchError(f"the agent had not exited {GRACE + 30:g}s after SIGTERM\n{agent.log_tail()}")
            finally:
                sel.close()
                for c in clients:
                    c.sock.close()
    exit_s = exited[0] - signalled[0]
    http = [c for c in clients if not c.websocket]
    return {
        "exit_s": exit_s,
        "rc": proc.returncode,
        "left_open": sum(1 for c in clients if c.ended_at is None),
        "http_closed_before_exit": sum(1 for c in http if c.ended_at is not None and c.ended_at <= exit_s),
        "ws_no_1001": sum(1 for c in clients if c.websocket and c.close_code != 1001),
        "metrics_answers_1s_before": answers_before,
    }
