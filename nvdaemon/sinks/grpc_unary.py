"""One unary gRPC call over HTTP/2 on a Unix socket, spoken with ``h2`` instead of grpcio.

NVSentinel's platform-connector is the agent's only gRPC peer and gets one kind of call (``HealthEventOccurredV1``,
a few per state change). grpcio cost the singlePod agent 14 MiB of peak resident memory for it (bench/rss.py); ``h2``
is already loaded by the agent's HTTP server (hypercorn), so this client costs next to nothing.

The call: connect (blocking, in the caller's worker thread), the HTTP/2 preface and SETTINGS, one stream with the
request headers and one length-prefixed message (1 byte compressed flag 0, 4 bytes big-endian length, the
serialized request), then read until the stream ends. The status is the trailers' ``grpc-status`` and
``grpc-message`` (percent-decoded), or the headers' in a trailers-only answer; an HTTP status other than 200 maps to
a code as in gRPC's http-grpc-status-mapping. Failures are ``RpcError`` with the code's name, as grpcio names them.

Bounds: ``timeout`` (seconds) covers the whole call, connect included, and is sent as ``grpc-timeout``; at most
``MAX_RESPONSE_BYTES`` of response messages, ``MAX_HEADER_LIST_BYTES`` per header block (our SETTINGS say so and
h2's decoder enforces it) and ``MAX_READ_BYTES`` read from the socket in all.
"""

from __future__ import annotations

import socket
import struct
import time
import urllib.parse

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

CODES = (
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
)
# gRPC's doc/http-grpc-status-mapping.md: the code for an answer without grpc-status and an HTTP status not 200.
HTTP_TO_CODE = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED"}
HTTP_TO_CODE |= dict.fromkeys((429, 502, 503, 504), "UNAVAILABLE")
# RST_STREAM error codes as grpc-core reads them (anything else is INTERNAL).
RESET_TO_CODE: dict[int, str] = {
    h2.errors.ErrorCodes.REFUSED_STREAM: "UNAVAILABLE",
    h2.errors.ErrorCodes.CANCEL: "CANCELLED",
    h2.errors.ErrorCodes.ENHANCE_YOUR_CALM: "RESOURCE_EXHAUSTED",
    h2.errors.ErrorCodes.INADEQUATE_SECURITY: "PERMISSION_DENIED",
}
MAX_RESPONSE_BYTES = 64 * 1024  # the answer is google.protobuf.Empty: a 5-byte frame
MAX_HEADER_LIST_BYTES = 16 * 1024
MAX_READ_BYTES = 1024 * 1024  # everything the peer may send on this connection: frames, SETTINGS, PINGs
_READ_CHUNK = 16 * 1024


class RpcError(Exception):
    """A call that did not end OK: ``code`` is the gRPC status code's name (``UNAVAILABLE``), ``details`` its
    message. Never holds a header value we sent (the token)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code
        self.details = details


def grpc_timeout(seconds: float) -> str:
    """The ``grpc-timeout`` header: at most 8 digits and a unit; milliseconds, rounded up."""
    millis = max(1, int(seconds * 1000 + 0.999))
    return f"{millis}m" if millis < 10**8 else f"{min(int(seconds) + 1, 10**8 - 1)}S"


def status_of(headers: dict[str, str]) -> tuple[str, str] | None:
    """(code name, message) from a header block holding ``grpc-status``; None when it has none."""
    raw = headers.get("grpc-status")
    if raw is None:
        return None
    message = urllib.parse.unquote(headers.get("grpc-message", ""), errors="replace")
    if not _number(raw):  # as grpcio: not a number is INTERNAL, a number no code has is UNKNOWN
        return "INTERNAL", f"grpc-status {raw[:16]!r} is not an integer"
    return (CODES[int(raw)] if int(raw) < len(CODES) else "UNKNOWN"), message


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 9


def _frame(message: bytes) -> bytes:
    return struct.pack(">BI", 0, len(message)) + message


class _Call:
    """The state of one call: the connection, the answer as far as it has come, the deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        # Header values stay bytes (decoded as latin-1 below): a peer's bytes need not be UTF-8.
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.stream = 0
        self.headers: dict[str, str] | None = None
        self.trailers: dict[str, str] | None = None
        self.body = bytearray()
        self.ended = False
        self.read_total = 0
        self.pending = bytearray()  # bytes read that do not make a whole frame yet

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self._settimeout()
            self.sock.sendall(data)

    def _settimeout(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RpcError("DEADLINE_EXCEEDED", "Deadline Exceeded")
        self.sock.settimeout(left)

    def pump(self) -> None:
        """Read once from the socket and handle what came; the answer goes into this call's fields."""
        self._settimeout()
        data = self.sock.recv(_READ_CHUNK)
        if not data:
            raise RpcError("UNAVAILABLE", "Socket closed")
        self.read_total += len(data)
        if self.read_total > MAX_READ_BYTES:
            raise RpcError("RESOURCE_EXHAUSTED", f"the peer sent more than {MAX_READ_BYTES} bytes")
        self.pending += data
        # One frame at a time, each frame's events handled before the next is read: h2 turns a frame that follows
        # a GOAWAY into a protocol error, which must not hide the GOAWAY.
        while len(self.pending) >= 9:
            size = 9 + int.from_bytes(self.pending[:3], "big")
            if len(self.pending) < size <= 9 + self.conn.max_inbound_frame_size:
                break  # a frame too large goes to h2 at once, for its FRAME_SIZE_ERROR
            frame, self.pending = bytes(self.pending[:size]), self.pending[size:]
            try:
                events = self.conn.receive_data(frame)
            except h2.exceptions.DenialOfServiceError as exc:  # a header list over our limit, among others
                raise RpcError("RESOURCE_EXHAUSTED", f"HTTP/2: {exc}") from None
            except h2.exceptions.ProtocolError as exc:
                raise RpcError("INTERNAL", f"HTTP/2 protocol error: {exc}") from None
            for event in events:
                self._handle(event)
        self.flush()  # SETTINGS and PING acks, window updates

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived) and event.stream_id == self.stream:
            self.headers = _decoded(event.headers)
        elif isinstance(event, h2.events.TrailersReceived) and event.stream_id == self.stream:
            self.trailers = _decoded(event.headers)
        elif isinstance(event, h2.events.DataReceived) and event.stream_id == self.stream:
            self.body += event.data
            if len(self.body) > MAX_RESPONSE_BYTES:
                raise RpcError("RESOURCE_EXHAUSTED", f"response larger than {MAX_RESPONSE_BYTES} bytes")
            self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id == self.stream:
            self.ended = True
        elif isinstance(event, h2.events.StreamReset) and event.stream_id == self.stream:
            error = event.error_code
            raise RpcError(RESET_TO_CODE.get(int(error), "INTERNAL"), f"stream reset by the peer: {error!s}")
        elif isinstance(event, h2.events.ConnectionTerminated) and not self.ended:
            # GOAWAY before the answer: UNAVAILABLE, retried on a new connection. For a stream above last_stream_id
            # (never processed) or with an error code that is grpcio's answer too. A graceful GOAWAY that covers our
            # stream (a server shutting down) would still be answered, but h2 closes its connection state on any
            # GOAWAY and refuses the frames after it (python-hyper/h2#1181), so the call is retried instead: the
            # event may reach the platform-connector twice, which a state it already holds absorbs.
            raise RpcError("UNAVAILABLE", f"connection closed by the peer (GOAWAY {event.error_code!s})")

    def send_body(self, body: bytes) -> None:
        """The message as DATA frames within the peer's flow-control window, the last one ending the stream."""
        view = memoryview(body)
        while True:
            window = self.conn.local_flow_control_window(self.stream)
            size = min(window, self.conn.max_outbound_frame_size, len(view))
            if size == 0 and view:
                self.pump()  # wait for a WINDOW_UPDATE
                if self.ended:
                    return  # answered before reading all of the request (an early error)
                continue
            self.conn.send_data(self.stream, bytes(view[:size]), end_stream=size == len(view))
            self.flush()
            view = view[size:]
            if not view:
                return

    def result(self) -> None:
        """Raise the call's failure; return when it ended OK."""
        trailers, headers = self.trailers, self.headers or {}
        status = status_of(trailers) if trailers is not None else status_of(headers)
        http = headers.get(":status", "")
        if status is None:
            if http != "200":
                code = HTTP_TO_CODE.get(int(http), "UNKNOWN") if _number(http) else "UNKNOWN"
                raise RpcError(code, f"HTTP status {http[:8]}")
            raise RpcError("UNKNOWN", "the answer has no grpc-status")
        code, message = status
        if code != "OK":
            raise RpcError(code, message)
        if self.body and (len(self.body) < 5 or self.body[0] != 0 or len(self.body) != 5 + _length(self.body)):
            raise RpcError("INTERNAL", "the response is not one uncompressed gRPC message")


def _length(body: bytearray) -> int:
    length: int = struct.unpack_from(">I", body, 1)[0]
    return length


def _decoded(headers: list[tuple[str, str]] | list[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in headers:
        out[name if isinstance(name, str) else name.decode("latin-1")] = (
            value if isinstance(value, str) else value.decode("latin-1")
        )
    return out


def unary_call(
    socket_path: str, method: str, request: bytes, *, timeout: float, metadata: tuple[tuple[str, str], ...] = ()
) -> None:
    """Call ``method`` (``/package.Service/Method``) with the serialized ``request`` on the Unix socket; return when
    the answer is OK, raise ``RpcError`` otherwise. Blocking: run it in a worker thread."""
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(max(timeout, 0.001))
        try:
            sock.connect(socket_path)
        except TimeoutError:
            raise RpcError("DEADLINE_EXCEEDED", "Deadline Exceeded") from None
        except OSError as exc:  # refused, gone since the stat, no permission: grpcio says UNAVAILABLE for each
            raise RpcError("UNAVAILABLE", f"failed to connect: {exc.strerror or type(exc).__name__}") from None
        call = _Call(sock, deadline)
        try:
            _run(call, method, request, timeout, metadata)
        except TimeoutError:
            raise RpcError("DEADLINE_EXCEEDED", "Deadline Exceeded") from None
        except OSError as exc:  # reset, broken pipe: the detail keeps the words classify looks for
            raise RpcError("UNAVAILABLE", f"socket error: {exc.strerror or type(exc).__name__}") from None
        except h2.exceptions.H2Error as exc:  # sending on a stream the peer's frames made invalid, among others
            raise RpcError("INTERNAL", f"HTTP/2: {type(exc).__name__}") from None
    finally:
        sock.close()


def _run(call: _Call, method: str, request: bytes, timeout: float, metadata: tuple[tuple[str, str], ...]) -> None:
    conn = call.conn
    # Our SETTINGS as initial values (``update`` would leave them pending until acknowledged, and the SETTINGS frame
    # would carry the old ones); the decoder is bounded from the start, not from the peer's acknowledgement on.
    conn.local_settings = h2.settings.Settings(
        client=True,
        initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 100,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_BYTES,
        },
    )
    conn.decoder.max_header_list_size = MAX_HEADER_LIST_BYTES
    conn.initiate_connection()
    call.stream = conn.get_next_available_stream_id()
    headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("grpc-timeout", grpc_timeout(timeout)),
        *metadata,
    ]
    conn.send_headers(call.stream, headers)
    call.flush()
    call.send_body(_frame(request))
    while not call.ended:
        call.pump()
    call.result()
