"""NVSentinel's wire: a HealthEvent as the platform-connector's protobuf bytes, the bearer token, one gRPC call, and
how a failed call is classified (``nvdaemon/sinks/nvsentinel_reconciler.py`` decides what to send and when).

- Socket gate: the socket path is stat'ed before every attempt. Nothing there (ENOENT) or something that is not a
  socket (a regular file, a directory: what a hostPath mount leaves when it is made before the platform-connector
  created its socket) is ``SocketMissing``, whose ``state`` says which ("missing", "not a socket: regular file"):
  the caller skips, counts, does not retry; a connect to a non-socket could only be refused. Any other stat error
  (EACCES, ENOTDIR) counts as present: the send is attempted and its failure classified.
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

import contextlib
import logging
import os
import re
import stat
import time
from collections.abc import Iterator
from typing import Protocol

from nvdaemon.sinks.grpc_unary import RpcError, unary_call
from nvdaemon.sinks.nvsentinel_map import Change, HealthEventSpec
from nvdaemon.sinks.nvsentinel_proto import health_events
from nvdaemon.token import read_token

METHOD = "/datamodels.PlatformConnector/HealthEventOccurredV1"
RETRYABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})
_RETRYABLE_DETAIL = re.compile(r"connection reset|broken pipe|ECONNRESET|EPIPE", re.IGNORECASE)
_HEADER_VALUE = re.compile(r"[\x20-\x7e]+")


class SocketMissing(Exception):
    """The platform-connector's socket is not at its path: skip, do not retry. ``state`` is what is there instead
    (``socket_state``)."""

    def __init__(self, path: str, state: str) -> None:
        super().__init__(f"socket {path}: {state}")
        self.path = path
        self.state = state


MISSING = "missing"
_KINDS = {
    stat.S_IFREG: "regular file",
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


def socket_state(path: str) -> str | None:
    """None when ``path`` can be connected to (a socket, or a stat error other than ENOENT: see ``GrpcPublisher``);
    else ``MISSING`` (nothing there, a dangling symlink included) or ``not a socket: <kind>``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return MISSING
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return None
    return f"not a socket: {_KINDS.get(stat.S_IFMT(mode), 'unknown file type')}"


class SocketStreak:
    """The socket's state across sends, so that a streak of skipped sends is logged once when it starts and once
    when it ends, not per send. The start line names what the first pass of the streak skipped (ERROR when a fatal
    fault is among them: NVSentinel will not act on it; else WARNING); the end line (INFO) how long the streak lasted
    and how many sends it skipped. A change of what is at the path (a file replaced by a directory) is logged as a
    new start. ``present``: None until the first send."""

    def __init__(self, path: str, log: logging.Logger) -> None:
        self.path = path
        self.log = log
        self.present: bool | None = None
        self.problem: str | None = None  # SocketMissing.state while a streak lasts
        self.since = 0.0  # time.monotonic() at the streak's start
        self.skipped = 0  # sends skipped in the streak
        self.unlogged: list[tuple[str, bool]] | None = None  # (what, fatal) skipped in a new streak's first pass
        self.in_pass = False

    def state(self) -> str | None:
        return self.problem or ("present" if self.present else None)

    @contextlib.contextmanager
    def one_pass(self) -> Iterator[None]:
        """A reconcile pass: a streak that starts in it is logged at its end, with everything it skipped."""
        self.in_pass = True
        try:
            yield
        finally:
            self.in_pass = False
            self._log_start()

    def unusable(self, problem: str, what: str, fatal: bool) -> None:
        """A send of ``what`` (``describe``) was skipped because of ``problem`` (``SocketMissing.state``)."""
        self.present = False
        if problem != self.problem:
            if self.problem is None:
                self.since, self.skipped = time.monotonic(), 0
            self.problem, self.unlogged = problem, []
        self.skipped += 1
        if self.unlogged is not None:
            self.unlogged.append((what, fatal))
        if not self.in_pass:
            self._log_start()

    def usable(self) -> bool:
        """A send got past the socket gate; True when that ended a streak."""
        self.present = True
        if self.problem is None:
            return False
        self._log_start()
        self.log.info(
            "nvsentinel: platform-connector socket %s is back after %.1fs (was %s); %d send(s) skipped meanwhile",
            self.path,
            time.monotonic() - self.since,
            self.problem,
            self.skipped,
        )
        self.problem = None
        return True

    def _log_start(self) -> None:
        skipped, self.unlogged = self.unlogged, None
        if not skipped:
            return
        shown = ", ".join(what for what, _ in skipped[:5])
        if len(skipped) > 5:
            shown += f" and {len(skipped) - 5} more"
        self.log.log(
            logging.ERROR if any(f for _, f in skipped) else logging.WARNING,
            "nvsentinel: platform-connector socket %s: %s; health events are not sent until it is back (each skip "
            "counted in nvsentinel_health_events_publisher_skipped_pc_unavailable, tried again every tick); "
            "skipped: %s",
            self.path,
            self.problem,
            shown,
        )


def fatal(change: Change) -> bool:
    """A fault NVSentinel would act on (a node condition): fatal and unhealthy."""
    return change.event.is_fatal and not change.event.is_healthy


def describe(change: Change) -> str:
    """``raise NvdaemonCpuPackageHot GPU=0 (fatal)``: a change as the socket's log lines name it."""
    what = " ".join(f"{e.type}={e.value}" for e in change.key[1])
    return f"{change.kind} {change.key[0]}" + (f" {what}" if what else "") + (" (fatal)" if fatal(change) else "")


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
        """Deliver one serialized request; raise SocketMissing (with its ``state``), TokenError, RpcError or OSError.
        Runs in a thread."""


class GrpcPublisher:
    """The platform-connector over its Unix socket: stat, read the token, one call on a fresh connection."""

    def __init__(self, socket_path: str, token_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.token_path = token_path
        self.timeout = timeout

    def present(self) -> bool:
        """Only "not found" or a file that is not a socket means absent. Any other stat error (EACCES on a parent
        directory, ENOTDIR, ...) counts as present, as in NVSentinel's own publishers: the call is made and its
        failure classified like any other, instead of a local stat error standing in for what the
        platform-connector would say."""
        return socket_state(self.socket_path) is None

    def send(self, request: bytes) -> None:
        state = socket_state(self.socket_path)
        if state is not None:
            raise SocketMissing(self.socket_path, state)
        token = bearer_token(self.token_path)
        metadata = (("authorization", f"Bearer {token}"),) if token is not None else ()
        unary_call(self.socket_path, METHOD, request, timeout=self.timeout, metadata=metadata)
