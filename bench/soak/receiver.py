"""The soak's webhook receiver: a real HTTP/1.1 server on loopback that flaps between four modes.

- ``ok``: every verified request is answered 200 (an *ack*);
- ``500``: answered 500 (the sender must retry);
- ``hang``: the request is read and never answered for ``hang_seconds`` (longer than the sink's ``timeoutSeconds``),
  then the connection is closed without an answer;
- ``down``: the listening socket is closed (connections refused) and every open connection is cut.

Every request is verified with the ``standardwebhooks`` library and parsed with the ``cloudevents`` SDK, as
``tests/sinks/receiver.py`` does; a request failing either is answered 401 / 400 and counted, never acked.

An ack is only ever written as a whole response on a connection the receiver keeps open, so the sender reads it.
The one exception is the cut when the receiver goes down: a 200 written just before the cut may never have been read
by the sender, which then (rightly) sends the event again. The same holds for an ack the sender closed its
connection right after: its request was cancelled before it read the answer (the reload storm replaces the endpoint
while a request is out; its successor sends the event again). Such acks are marked ``unconfirmed`` (written on a
connection cut within ``CUT_WINDOW`` seconds, or closed by the sender within ``CLOSE_WINDOW``), so the verdict can
tell that duplicate from a sender bug.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from bench.common import free_port
from tests.sinks.receiver import parse_cloudevent, signature_ok

MODES = ("ok", "500", "hang", "down")
CUT_WINDOW = 2.0  # an ack written this long before its connection was cut may not have been read
CLOSE_WINDOW = 0.5  # likewise before the sender closed the connection (its request cancelled while it waited)
DOWN_GRACE = 0.3  # going down: requests in flight get this long to finish before the connections are cut


@dataclass
class Receipt:
    at: float  # time.monotonic()
    event_id: str | None
    answered: str  # "200", "500", "hang", "drop", "401", "400"
    conn: int
    data: dict[str, Any] | None = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a connection the receiver cut (going down) fails in its handler thread: expected, not news


class FlappingReceiver:
    def __init__(self, secret: str, hang_seconds: float) -> None:
        self.secret = secret
        self.hang_seconds = hang_seconds
        self.mode = "down"
        self.lock = threading.Lock()
        self.receipts: list[Receipt] = []
        self.release = threading.Event()  # set when the receiver stops for good: hanging handlers return
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: dict[int, socket.socket] = {}
        self._next_conn = 0
        self._cuts: dict[int, float] = {}  # connection -> when the receiver cut it
        self._closes: dict[int, float] = {}  # connection -> when it ended otherwise (the sender closed it)
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/soak"

    # ---- modes ----------------------------------------------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        """Switch mode (blocking: call it from a worker thread). Leaving ``down`` listens again."""
        assert mode in MODES, mode
        if mode == "down":
            if self.mode != "down":
                self.mode = "down"
                self._go_down()
            return
        if self.mode == "down":
            self._listen()
        self.mode = mode

    def close(self) -> None:
        self.release.set()
        self.mode = "down"
        self._go_down()

    def _listen(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                server = _Server(("127.0.0.1", self.port), self._handler())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def _go_down(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        time.sleep(DOWN_GRACE)
        now = time.monotonic()
        with self.lock:
            conns, self._conns = dict(self._conns), {}
            self._cuts.update(dict.fromkeys(conns, now))
        for c in conns.values():
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()

    # ---- what arrived ---------------------------------------------------------------------------------------
    def snapshot(self) -> list[Receipt]:
        with self.lock:
            return list(self.receipts)

    def unconfirmed(self, r: Receipt) -> bool:
        """An ack written shortly before (or while) the receiver cut its connection, or just before the sender closed
        it: maybe never read."""
        with self.lock:
            cut, closed = self._cuts.get(r.conn), self._closes.get(r.conn)
        if r.answered != "200":
            return False
        return (cut is not None and cut - r.at < CUT_WINDOW) or (closed is not None and closed - r.at < CLOSE_WINDOW)

    def acked_ids(self) -> set[str]:
        with self.lock:
            return {r.event_id for r in self.receipts if r.answered == "200" and r.event_id}

    # ---- the handler ----------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            conn_id = 0

            def setup(self) -> None:
                super().setup()
                with receiver.lock:
                    receiver._next_conn += 1
                    self.conn_id = receiver._next_conn
                    receiver._conns[self.conn_id] = self.connection

            def finish(self) -> None:
                with receiver.lock:
                    receiver._conns.pop(self.conn_id, None)
                    if self.conn_id not in receiver._cuts:  # the sender closed it (or a hang/drop: no ack there)
                        receiver._closes[self.conn_id] = time.monotonic()
                with contextlib.suppress(OSError):
                    super().finish()

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                rec = receiver._record(headers, body, self.conn_id)
                mode = receiver.mode
                if rec.answered:  # 401 / 400: the request itself is wrong
                    status = int(rec.answered)
                elif mode == "ok":
                    status = 200
                elif mode == "500":
                    status = 500
                else:  # hang, or a request that arrived on an open connection while going down
                    rec.answered = "hang" if mode == "hang" else "drop"
                    with receiver.lock:
                        receiver.receipts.append(rec)
                    if mode == "hang":
                        receiver.release.wait(receiver.hang_seconds)
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                payload = b"ok" if status < 300 else b"no"
                self.send_response(status)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()
                rec.answered = str(status)
                rec.at = time.monotonic()
                with receiver.lock:
                    receiver.receipts.append(rec)

        return Handler

    def _record(self, headers: dict[str, str], body: bytes, conn: int) -> Receipt:
        rec = Receipt(time.monotonic(), None, "", conn)
        if not signature_ok(self.secret, headers, body):
            rec.answered = "401"
            return rec
        parsed = parse_cloudevent(headers, body)
        if parsed is None:
            rec.answered = "400"
            return rec
        rec.event_id, _, data = parsed
        rec.data = data if isinstance(data, dict) else None
        if headers.get("webhook-id") != rec.event_id:
            rec.answered = "400"
        return rec
