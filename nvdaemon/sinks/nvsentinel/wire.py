"""NVSentinel's wire: a HealthEvent as the platform-connector's protobuf message, the bearer token, one gRPC call, and
how a failed call is classified (``nvdaemon/sinks/nvsentinel_reconciler.py`` decides what to send and when).

- Socket gate (``socket.socket_state``): the socket path is stat'ed before every attempt. Nothing there
  (ENOENT) or something that is not a socket (a regular file, a directory: what a hostPath mount leaves when it is
  made before the platform-connector created its socket) is ``SocketMissing``, whose ``state`` says which
  ("missing", "not a socket: regular file"): the caller skips, counts, does not retry; a connect to a non-socket
  could only be refused. Any other stat error (EACCES, ENOTDIR) counts as present: the send is attempted and its
  failure classified.
- Retryable (``classify``): UNAVAILABLE, DEADLINE_EXCEEDED, and any code whose message tells of a connection reset
  or a broken pipe; any other answer is a rejection. Each call has ``callTimeoutSeconds``.
- The token file is read on every call (``nvdaemon.token.read_token``, the server's reader too: surrounding
  whitespace such as a trailing newline is not part of the token, at most 8 KiB) and sent as
  ``authorization: Bearer <token>``; an empty ``tokenPath`` sends no header; an unreadable, empty or oversized token
  file (or one holding bytes a header cannot carry) is a ``TokenError`` that blocks the send. The token is never in
  an error message.

The call is grpcio's, through the stub generated from protos/health_event.proto (``nvdaemon.proto``), so every
answer ends as gRPC ends it (a graceful GOAWAY, a compressed answer, any header value a peer's gRPC stack writes).
grpcio's stub is synchronous (grpc.aio does not run under trio): the reconciler calls ``send`` in a worker thread,
and ``grpc`` is imported there, on the first call, so only an agent with this sink enabled loads it. One channel per
publisher, made on the first call and kept while calls succeed and more are due; a failed call closes it, so the
next attempt connects afresh (a restarted platform-connector is reached at once, not after the channel's own
reconnect backoff), and so does a pass that leaves nothing to send (``release``: an idle channel costs CPU).
``close`` (the sink replaced or stopped) closes it and ends a call still in flight as CANCELLED.
"""

from __future__ import annotations

import os
import re
import threading
from typing import TYPE_CHECKING, Protocol

from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.sinks.nvsentinel.map import PROCESSING_STRATEGIES, RECOMMENDED_ACTIONS, HealthEventSpec
from nvdaemon.sinks.nvsentinel.socket import SocketMissing, socket_state
from nvdaemon.token import read_token

if TYPE_CHECKING:
    import grpc

    from nvdaemon.proto.health_event_pb2_grpc import PlatformConnectorStub

RETRYABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
# The answer is google.protobuf.Empty (0 bytes); grpcio's default limit is 4 MiB.
MAX_RESPONSE_BYTES = 64 * 1024
_RETRYABLE_DETAIL = re.compile(r"connection reset|broken pipe|ECONNRESET|EPIPE", re.IGNORECASE)
_HEADER_VALUE = re.compile(r"[\x20-\x7e]+")


class TokenError(Exception):
    """The token file cannot be used; the message never contains the token."""


class RpcError(Exception):
    """A call that did not end OK, as plain values: ``code`` is the gRPC status code's name (``UNAVAILABLE``),
    ``details`` its message. Never holds a header value we sent (the token)."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code
        self.details = details


class SendError(Exception):
    """A call that did not return OK, with the status code name used as the metric label."""

    def __init__(self, code: str, detail: str, retryable: bool) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.retryable = retryable


def to_proto(spec: HealthEventSpec, *, now: float, event_id: str) -> pb.HealthEvents:
    """The ``HealthEvents`` request (version 1, one event) for ``spec``, stamped with ``now`` (seconds since the
    epoch) and ``event_id``."""
    event = pb.HealthEvent(
        version=1,
        agent=spec.agent,
        componentClass=spec.component_class,
        checkName=spec.check_name,
        isFatal=spec.is_fatal,
        isHealthy=spec.is_healthy,
        message=spec.message,
        recommendedAction=RECOMMENDED_ACTIONS[spec.recommended_action],  # type: ignore[arg-type]
        errorCode=list(spec.error_code),
        entitiesImpacted=[pb.Entity(entityType=e.type, entityValue=e.value) for e in spec.entities],
        metadata=dict(spec.metadata),
        nodeName=spec.node_name,
        processingStrategy=PROCESSING_STRATEGIES[spec.processing_strategy],  # type: ignore[arg-type]
        id=event_id,
        customRecommendedAction=spec.custom_recommended_action,
    )
    event.generatedTimestamp.FromNanoseconds(int(now * 1e9))  # always set, 0 included
    return pb.HealthEvents(version=1, events=[event])


def bearer_token(path: str) -> str | None:
    """The token for the ``authorization`` header, read by the agent's one token reader (``nvdaemon.token``: the
    whitespace around it is not part of it); None when no token is configured (an empty ``tokenPath``)."""
    if not path:
        return None
    try:
        data = read_token(path)
    except OSError as exc:
        raise TokenError(f"token file {path} is unreadable: {exc.strerror or type(exc).__name__}") from None
    except ValueError as exc:
        raise TokenError(str(exc)) from None  # names the file and the limit, never the token
    try:
        token = data.decode("ascii")
    except UnicodeDecodeError:
        raise TokenError(f"token file {path} holds bytes that cannot go in a header") from None
    if not _HEADER_VALUE.fullmatch(token):
        raise TokenError(f"token file {path} holds characters that cannot go in a header")
    return token


def classify(exc: BaseException) -> SendError:
    if isinstance(exc, SendError):
        return exc
    if isinstance(exc, RpcError):
        retryable = exc.code in RETRYABLE_CODES or bool(_RETRYABLE_DETAIL.search(exc.details))
        return SendError(exc.code, exc.details, retryable)
    if isinstance(exc, ConnectionResetError):
        return SendError("CONNECTION_RESET", str(exc), True)
    if isinstance(exc, BrokenPipeError):
        return SendError("BROKEN_PIPE", str(exc), True)
    return SendError(type(exc).__name__.upper(), str(exc), False)


class Publisher(Protocol):
    def send(self, request: pb.HealthEvents) -> None:
        """Deliver one request; raise SocketMissing (with its ``state``), TokenError, RpcError or OSError. Runs in a
        thread."""


class GrpcPublisher:
    """The platform-connector over its Unix socket: stat, read the token, one call on the publisher's channel."""

    def __init__(self, socket_path: str, token_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.token_path = token_path
        self.timeout = timeout
        self._lock = threading.Lock()  # the channel is made, dropped and closed from worker threads and the loop
        self._channel: grpc.Channel | None = None
        self._stub: PlatformConnectorStub | None = None
        self._closed = False

    def present(self) -> bool:
        """Only "not found" or a file that is not a socket means absent. Any other stat error (EACCES on a parent
        directory, ENOTDIR, ...) counts as present, as in NVSentinel's own publishers: the call is made and its
        failure classified like any other, instead of a local stat error standing in for what the
        platform-connector would say."""
        return socket_state(self.socket_path) is None

    def send(self, request: pb.HealthEvents) -> None:
        state = socket_state(self.socket_path)
        if state is not None:
            self._drop(None)  # whatever the channel was connected to is gone
            raise SocketMissing(self.socket_path, state)
        token = bearer_token(self.token_path)
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        import grpc  # loaded already after the first call; imported here, in the worker thread, not by the loop

        channel, stub = self._open()
        try:
            stub.HealthEventOccurredV1(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as exc:
            self._drop(channel)
            if isinstance(exc, grpc.Call):
                raise RpcError(exc.code().name, exc.details() or "") from None
            raise RpcError("UNKNOWN", str(exc)) from None
        except ValueError as exc:  # "Cannot invoke RPC on closed channel!": closed by ``close`` meanwhile
            self._drop(channel)
            raise RpcError("CANCELLED", str(exc)) from None

    def _open(self) -> tuple[grpc.Channel, PlatformConnectorStub]:
        import grpc

        from nvdaemon.proto.health_event_pb2_grpc import PlatformConnectorStub

        with self._lock:
            if self._closed:
                raise RpcError("CANCELLED", "the sink is closed")
            if self._channel is None or self._stub is None:
                target = "unix://" + os.path.abspath(self.socket_path)
                options = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)]
                self._channel = grpc.insecure_channel(target, options=options)
                self._stub = PlatformConnectorStub(self._channel)  # type: ignore[no-untyped-call]
            return self._channel, self._stub

    def _drop(self, channel: grpc.Channel | None) -> None:
        """Close ``channel`` (None: whichever is open) unless another call has replaced it already."""
        with self._lock:
            if channel is None:
                channel = self._channel
            if channel is None or channel is not self._channel:
                return
            self._channel = self._stub = None
        channel.close()

    def release(self) -> None:
        """Nothing is left to send: the channel is closed until the next call, which opens a new one. An open
        channel keeps grpcio's polling threads busy while it idles: 20 ms of CPU in 30 s connected to an idle
        server, 190 ms when its server is gone and it keeps reconnecting; 0 once closed (measured on a 2-CPU VM
        with grpcio 1.85, a channel on a Unix socket, os.times() over 30 s). A call costs one new connection on
        a local socket instead, and calls are rare: one per change of a node's health."""
        self._drop(None)

    def close(self) -> None:
        """No more calls: the channel is closed (a call in flight ends CANCELLED) and none is made again."""
        with self._lock:
            self._closed = True
        self._drop(None)
