"""NVSentinel's wire: a HealthEvent as the platform-connector's protobuf bytes, the bearer token, one gRPC call, and
how a failed call is classified (``nvdaemon/sinks/nvsentinel_reconciler.py`` decides what to send and when).

- Socket gate: the socket is stat'ed before every attempt; missing (ENOENT only) is ``SocketMissing`` (the caller
  skips, counts, does not retry). Any other stat error counts as present: the send is attempted and its failure
  classified.
- Retryable (``classify``): UNAVAILABLE, DEADLINE_EXCEEDED, connection reset and broken pipe; any other answer is a
  rejection. Each call has ``callTimeoutSeconds``.
- The token file is read on every call (``nvdaemon.token.read_token``, the server's reader too: surrounding
  whitespace such as a trailing newline is not part of the token, at most 8 KiB) and sent as
  ``authorization: Bearer <token>``; an empty ``tokenPath`` sends no header; an unreadable, empty or oversized token
  file (or one holding bytes a header cannot carry) is a ``TokenError`` that blocks the send. The token is never in
  an error message.

The call is ``nvdaemon.sinks.grpc_unary`` (gRPC over HTTP/2 with ``h2``, not grpcio: grpcio's import and channel
cost the singlePod agent 14 MiB of peak memory for this one call). It blocks; the reconciler calls ``send`` in a
worker thread. A new connection per call, so a restarted platform-connector is reached at once (calls are rare: one
per state change).
"""

from __future__ import annotations

import os
import re
from typing import Protocol

from nvdaemon.sinks.grpc_unary import RpcError, unary_call
from nvdaemon.sinks.nvsentinel_map import HealthEventSpec
from nvdaemon.sinks.nvsentinel_proto import health_events
from nvdaemon.token import read_token

METHOD = "/datamodels.PlatformConnector/HealthEventOccurredV1"
RETRYABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
_RETRYABLE_DETAIL = re.compile(r"connection reset|broken pipe|ECONNRESET|EPIPE", re.IGNORECASE)
_HEADER_VALUE = re.compile(r"[\x20-\x7e]+")


class SocketMissing(Exception):
    """The platform-connector's socket does not exist: skip, do not retry."""


class TokenError(Exception):
    """The token file cannot be used; the message never contains the token."""


class SendError(Exception):
    """A call that did not return OK, with the status code name used as the metric label."""

    def __init__(self, code: str, detail: str, retryable: bool) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.retryable = retryable


def to_proto(spec: HealthEventSpec, *, now: float, event_id: str) -> bytes:
    """The serialized ``HealthEvents`` request for ``spec`` (``nvdaemon.sinks.nvsentinel_proto``: no protobuf
    runtime in the agent), stamped with ``now`` (seconds since the epoch) and ``event_id``."""
    return health_events(spec, now=now, event_id=event_id)


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
    def send(self, request: bytes) -> None:
        """Deliver one serialized request; raise SocketMissing, TokenError, RpcError or OSError. Runs in a thread."""


class GrpcPublisher:
    """The platform-connector over its Unix socket: stat, read the token, one call on a fresh connection."""

    def __init__(self, socket_path: str, token_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.token_path = token_path
        self.timeout = timeout

    def present(self) -> bool:
        """Only "not found" means absent. Any other stat error (EACCES on a parent directory, ENOTDIR, ...) counts
        as present, as in NVSentinel's own publishers: the call is made and its failure classified like any other,
        instead of a local stat error standing in for what the platform-connector would say."""
        try:
            os.stat(self.socket_path)
        except FileNotFoundError:
            return False
        except OSError:
            return True
        return True

    def send(self, request: bytes) -> None:
        if not self.present():
            raise SocketMissing(self.socket_path)
        token = bearer_token(self.token_path)
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        unary_call(self.socket_path, METHOD, request, timeout=self.timeout, metadata=metadata)
