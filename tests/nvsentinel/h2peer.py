"""A scripted HTTP/2 peer on a Unix socket that answers the one gRPC call the way a broken or hostile
platform-connector might: trailers-only errors, an HTTP error status, a close mid-answer, no answer at all, an
oversized answer or header list, a reset stream. tests/nvsentinel/connector.py is the well-behaved (grpcio) one.

Each connection is served in its own thread until the client closes it; ``requests`` keeps the headers and body of
every request the peer read in full.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import hyperframe.frame

GRPC_OK_BODY = b"\x00\x00\x00\x00\x00"  # google.protobuf.Empty as one uncompressed gRPC message
BEHAVIOURS = (
    "ok",
    "trailers-only",  # headers with grpc-status and END_STREAM: no trailers
    "status",  # headers, one message, trailers with grpc-status ``status`` and grpc-message ``message``
    "http",  # :status ``http`` without grpc-status
    "close-mid-stream",  # response headers, then the connection is closed
    "silent",  # reads the request, never answers
    "oversized",  # a message of ``size`` bytes
    "huge-header",  # a response header of ``size`` bytes
    "reset",  # RST_STREAM with ``reset``
    "goaway",  # GOAWAY before the stream was processed, then the connection is closed
    "graceful-goaway",  # GOAWAY that covers the stream (a server shutting down), then the answer OK
)


def _status(params: dict[str, object]) -> list[tuple[bytes, bytes]]:
    """grpc-status and grpc-message from ``status`` and ``message`` (str, or bytes sent as they are)."""
    status, message = params["status"], params.get("message", "")
    raw = [v if isinstance(v, bytes) else str(v).encode() for v in (status, message)]
    return [(b"grpc-status", raw[0]), (b"grpc-message", raw[1])]


class H2Peer:
    def __init__(self, socket_path: Path, behaviour: str, **params: object) -> None:
        assert behaviour in BEHAVIOURS, behaviour
        self.socket_path = socket_path
        self.behaviour = behaviour
        self.params = params
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.threads: list[threading.Thread] = []

    def __enter__(self) -> H2Peer:
        self.listener.bind(str(self.socket_path))
        self.listener.listen(4)
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self.threads.append(accept)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for t in self.threads:
            t.join(10)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, sock: socket.socket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        headers: dict[str, str] = {}
        body = bytearray()
        with sock:
            sock.sendall(conn.data_to_send())
            try:
                while True:
                    data = sock.recv(65536)
                    if not data:
                        return
                    for event in conn.receive_data(data):
                        if isinstance(event, h2.events.RequestReceived):
                            headers = {str(k): str(v) for k, v in event.headers}
                        elif isinstance(event, h2.events.DataReceived):
                            body += event.data
                            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        elif isinstance(event, h2.events.StreamEnded):
                            self.requests.append((headers, bytes(body)))
                            if not self._answer(sock, conn, event.stream_id):
                                return
                    sock.sendall(conn.data_to_send())
            except OSError:
                return  # the client went away mid-answer: what the bounded cases expect

    def _answer(self, sock: socket.socket, conn: h2.connection.H2Connection, sid: int) -> bool:
        """Answer the stream; False when the connection is to be closed at once."""
        p = self.params
        grpc_headers = [(":status", "200"), ("content-type", "application/grpc")]
        if self.behaviour in ("ok", "graceful-goaway"):
            if self.behaviour == "graceful-goaway":  # written by hand: h2 sends nothing after its own GOAWAY
                goaway = hyperframe.frame.GoAwayFrame(0)
                goaway.last_stream_id, goaway.error_code = sid, 0
                sock.sendall(conn.data_to_send() + goaway.serialize())
            conn.send_headers(sid, grpc_headers)
            conn.send_data(sid, GRPC_OK_BODY)
            conn.send_headers(sid, [("grpc-status", "0")], end_stream=True)
        elif self.behaviour == "trailers-only":
            conn.send_headers(sid, [*grpc_headers, *_status(p)], end_stream=True)
        elif self.behaviour == "status":
            conn.send_headers(sid, grpc_headers)
            conn.send_data(sid, GRPC_OK_BODY)
            conn.send_headers(sid, _status(p), end_stream=True)
        elif self.behaviour == "http":
            conn.send_headers(sid, [(":status", str(p["http"])), ("content-type", "text/plain")])
            conn.send_data(sid, b"not grpc\n", end_stream=True)
        elif self.behaviour == "close-mid-stream":
            conn.send_headers(sid, grpc_headers)
            sock.sendall(conn.data_to_send())
            return False
        elif self.behaviour == "silent":
            pass
        elif self.behaviour == "oversized":
            conn.send_headers(sid, grpc_headers)
            size = int(str(p["size"]))
            self._send_flow_controlled(sock, conn, sid, b"\x00" + size.to_bytes(4, "big") + b"\x01" * size)
        elif self.behaviour == "huge-header":
            conn.send_headers(sid, [*grpc_headers, ("x-padding", "a" * int(str(p["size"])))])
        elif self.behaviour == "reset":
            conn.reset_stream(sid, h2.errors.ErrorCodes(int(str(p["reset"]))))
        elif self.behaviour == "goaway":
            conn.close_connection(last_stream_id=0)
            sock.sendall(conn.data_to_send())
            return False
        return True

    @staticmethod
    def _send_flow_controlled(sock: socket.socket, conn: h2.connection.H2Connection, sid: int, data: bytes) -> None:
        while data:
            size = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size, len(data))
            if size == 0:
                sock.sendall(conn.data_to_send())
                more = sock.recv(65536)
                if not more:
                    raise ConnectionResetError("the client went away")
                conn.receive_data(more)  # WINDOW_UPDATEs
                continue
            conn.send_data(sid, data[:size])
            data = data[size:]
        sock.sendall(conn.data_to_send())
