"""A real webhook receiver on loopback for the tests: a threaded HTTP/1.1 server with scripted answers.

Every request is verified with the ``standardwebhooks`` library (when the receiver holds a secret) and parsed with
the ``cloudevents`` SDK; a request failing either is answered 401 / 400 and recorded as such, so a test that only
looks at what arrived still fails when signing or the envelope broke.

Scripted behaviours, consumed one per request (then ``default``): an int status, ``(status, {headers})``,
``"hang"`` (read the request, never answer until the receiver stops) or ``"drop"`` (read the request, close the
connection without an answer: the receiver got it, the sender never learns).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.polling import until_sync

Behaviour = int | tuple[int, dict[str, str]] | str


def signature_ok(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks signature checked by the reference library, not by our code."""
    try:
        Webhook(secret).verify(body, headers)
    except WebhookVerificationError:
        return False
    return True


def parse_cloudevent(headers: dict[str, str], body: bytes) -> tuple[str, dict[str, Any], Any] | None:
    """(id, attributes, data) read by the CloudEvents SDK (either mode), or None when it is not a CloudEvent."""
    try:
        event = from_http_event(HTTPMessage(headers=headers, body=body))
    except Exception:
        return None
    data = event.get_data()
    if isinstance(data, bytes | str):
        data = json.loads(data)
    return event.get_id(), event.get_attributes(), data


@dataclass
class Received:
    at: float
    headers: dict[str, str]
    body: bytes
    client_port: int
    verified: bool
    event_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)
    data: Any = None
    answered: int | str = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class Receiver:
    def __init__(self, secret: str | None = None, port: int = 0) -> None:
        self.secret = secret
        self.port = port
        self.script: list[Behaviour] = []
        self.default: Behaviour = 200
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.release = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        if port == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/hw?token=do-not-show"

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> Receiver:
        self.release.clear()
        self._server = _Server(("127.0.0.1", self.port), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Down: stop listening and cut every open connection (keep-alive ones too)."""
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:
            conns, self._conns = list(self._conns), set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- what arrived ---------------------------------------------------------------------------------------
    def ids(self) -> list[str]:
        with self.lock:
            return [r.event_id for r in self.received if r.event_id is not None]

    def seqs(self) -> list[int]:
        with self.lock:
            return [int(r.data["seq"]) for r in self.received if r.data is not None]

    def wait(self, predicate: Callable[[Receiver], bool], timeout: float = 15.0) -> None:
        until_sync(
            lambda: predicate(self), lambda: f"the receiver's condition; got {self.ids()}", timeout=timeout, step=0.02
        )

    # ---- the handler ----------------------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with receiver.lock:
                    receiver._conns.add(self.connection)

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                rec = receiver._record(headers, body, self.client_address[1])
                with receiver.lock:
                    behaviour = receiver.script.pop(0) if receiver.script else receiver.default
                    receiver.received.append(rec)
                if not rec.verified:
                    behaviour = 401
                elif rec.event_id is None:
                    behaviour = 400
                rec.answered = behaviour if isinstance(behaviour, int | str) else behaviour[0]
                if behaviour == "hang":
                    receiver.release.wait(30)
                    self.close_connection = True
                    return
                if behaviour == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                assert not isinstance(behaviour, str)
                status, extra = (behaviour, {}) if isinstance(behaviour, int) else behaviour
                self.send_response(status)
                for k, v in extra.items():
                    self.send_header(k, v)
                payload = b"ok" if status < 300 else b"no"
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler

    def _record(self, headers: dict[str, str], body: bytes, port: int) -> Received:
        verified = self.secret is None or signature_ok(self.secret, headers, body)
        rec = Received(time.monotonic(), headers, body, port, verified)
        parsed = parse_cloudevent(headers, body)
        if parsed is not None:
            rec.event_id, rec.attributes, rec.data = parsed
        return rec
