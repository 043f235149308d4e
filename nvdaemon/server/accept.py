"""Serving the listening sockets: hypercorn's trio worker (``worker_serve``) with a bound on connections.

Why not ``hypercorn.trio.serve``: it binds inside (``nvdaemon/server/listen.py`` binds instead) and accepts with
``trio.serve_listeners``, which takes one connection per scheduler pass, accepts without limit and, out of file
descriptors, logs a traceback and retries ten times a second. Here:

- every pending connection is accepted in one pass (``BatchListener``): under load a pass is long, and a kubelet
  probe waited in the kernel's queue behind hundreds of clients;
- at most ``Limits.max_connections`` connections are served at once (further capped so that ``FD_RESERVE`` file
  descriptors of RLIMIT_NOFILE stay free for collectors, sqlite and subprocesses, besides the pseudo files the
  collectors hold open). Above it a connection goes to the probe lane: its request head is read with a short
  deadline and ``/healthz`` and ``/readyz`` are answered there (the kubelet must see the agent alive while clients
  hold every slot); anything else gets 503. When the lane is full too, the connection is closed at once;
- ``accept`` failing for lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) is logged once per burst, with a count
  when it ends, and retried every ``ACCEPT_RETRY_SECONDS``.
"""

from __future__ import annotations

import errno
import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import MAX_RECV, TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import wrap_app

from nvdaemon import shutdown
from nvdaemon.collectors.heldfiles import held_cap
from nvdaemon.server.asgi import Probe
from nvdaemon.server.listen import describe

log = logging.getLogger(__name__)

FD_RESERVE = 64  # descriptors of RLIMIT_NOFILE never given to connections
PROBE_LANE = 32  # connections above the cap that are still read, for /healthz and /readyz
PROBE_HEAD_BYTES = 8192  # a probe's request head larger than this is refused
ACCEPT_RETRY_SECONDS = 0.1
ACCEPT_BATCH = 256  # connections taken from the kernel's queue per scheduler pass, at most
CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}
IGNORED_ACCEPT_ERRNOS = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM}  # the peer gave up first (as trio ignores)


def connection_cap(max_connections: int) -> int:
    """``max_connections``, lowered so that FD_RESERVE descriptors, the probe lane and the collectors' held pseudo
    files (``collectors.heldfiles.held_cap``) fit under RLIMIT_NOFILE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - FD_RESERVE - PROBE_LANE - held_cap()))


class _TCPServer(TCPServer):
    """Hypercorn's connection, with two timers where hypercorn has one, ending when the peer has gone.

    **Two timers.** Hypercorn runs one timer (``keep_alive_timeout``) from the connection's start and from the end of
    each response until the next request head is complete: it bounds a client dribbling a head and an idle
    keep-alive connection alike, so one value served both, the shorter. Prometheus keeps its connection between
    scrapes (Prometheus 2.42 scraping every 15 s reused one connection for every scrape), so an idle limit below the
    scrape interval made it reconnect for every scrape, a new connection each time (TCP set-up and hypercorn's
    per-connection tasks: ``make bench ARGS=scrape``, keep-alive against new-connection rows). Here, as Go's
    ``net/http`` does with ``IdleTimeout`` and ``ReadHeaderTimeout``: a head must be complete within
    ``header_timeout`` of the connection's start, or of its first byte once the connection was idle; an idle
    connection (a response sent, no byte of the next request yet) is closed after ``idle_timeout``.

    **Ending when the peer has gone**: the idle timer otherwise keeps the connection's task group, and so its slot
    under the cap, for up to the idle limit after the peer closed. And ending when hypercorn has closed the socket
    itself (``closed``, called then): a client that had already sent its next request when the server decided to
    close (keep-alive not recycled while stopping) leaves hypercorn's reader waiting for a resume that never comes,
    on a closed socket, until the graceful timeout cancels it."""

    def __init__(self, *args: Any, closed: Callable[[], None], header_timeout: float, idle_timeout: float) -> None:
        super().__init__(*args)
        self._closed = closed
        self._header_limit = header_timeout
        self._idle_limit = idle_timeout
        self._idle = False  # a response was sent and no byte of the next request has come yet (the timer's kind)

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated):
            # Idle: bytes of a next (pipelined) request already received and held by h11 are a head under way.
            self._idle = event.idle and not _holds_bytes(self.protocol)
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        # hypercorn's loop (trio/tcp_server.py), with the switch to the head's timer on an idle connection's first
        # byte; its read_timeout is off here (nvdaemon/server/app.py says why).
        while True:
            try:
                data = await self.stream.receive_some(MAX_RECV)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                break
            if data and self._idle:
                self._idle = False
                await self.idle_task.restart(self._task_group, self._idle_timeout)
            await self.protocol.handle(RawData(bytes(data)))
            if data == b"":
                break
        await self.protocol.handle(Closed())
        await self.idle_task.stop()

    async def _idle_timeout(self) -> None:
        with trio.move_on_after(self._idle_limit if self._idle else self._header_limit):
            await self.context.terminated.wait()
        with trio.CancelScope(shield=True):
            await self._initiate_server_close()

    async def _close(self) -> None:
        try:
            await super()._close()
        finally:
            self._closed()

    async def _initiate_server_close(self) -> None:
        try:
            await super()._initiate_server_close()
        finally:
            self._closed()


def _holds_bytes(protocol: Any) -> bool:
    """Whether the connection's HTTP/1.1 parser holds received bytes it has not made a request of yet."""
    connection = getattr(getattr(protocol, "protocol", None), "connection", None)
    trailing = getattr(connection, "trailing_data", (b"", False))
    return bool(trailing[0])


@dataclass
class Limits:
    max_connections: int
    probe_deadline: float  # seconds a lane connection has to send its request head
    header_timeout: float  # seconds a request head has to be complete (from the start, or the first byte)
    idle_timeout: float  # seconds an idle keep-alive connection is kept


class AcceptErrors:
    """Logs the first resource failure of ``accept`` in a burst, and how many there were once one succeeds."""

    def __init__(self) -> None:
        self.in_burst = 0
        self.total = 0

    def failed(self, exc: OSError) -> None:
        if not self.in_burst:
            log.error("accept failed: %s; retrying every %.1fs (logged once per burst)", exc, ACCEPT_RETRY_SECONDS)
        self.in_burst += 1
        self.total += 1

    def succeeded(self) -> None:
        if self.in_burst:
            log.warning("accept works again after %d failed attempt(s)", self.in_burst)
        self.in_burst = 0


@dataclass
class Gate:
    """Open connections, by lane; what was turned away while at the cap (logged when the cap is reached and when
    a connection is served again, not per connection)."""

    cap: int
    open: int = 0
    lane: int = 0
    overflowed: int = 0  # connections taken by the lane or closed at once since the cap was reached

    def admit(self) -> str:
        """Where the next connection goes: "serve", "lane" or "refuse"."""
        if self.open < self.cap:
            if self.overflowed:
                log.warning("connections below the cap again; %d connection(s) went over it", self.overflowed)
                self.overflowed = 0
            self.open += 1
            return "serve"
        if not self.overflowed:
            log.warning("connection cap %d reached: only /healthz and /readyz are answered, others get 503", self.cap)
        self.overflowed += 1
        if self.lane < PROBE_LANE:
            self.lane += 1
            return "lane"
        return "refuse"


async def serve(
    app: Any,
    hc: HypercornConfig,
    socks: list[socket.socket],
    *,
    limits: Limits,
    probe: Probe,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``socks`` (closed on return; one cap over all of them) until ``shutdown_trigger`` returns,
    then stop accepting, close idle keep-alive connections and give the others ``hc.graceful_timeout``, never past
    the shutdown deadline (hypercorn's order); those still open then are closed, a write blocked on a peer that does
    not read included."""
    wrapped = wrap_app(app, hc.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)
    state: dict[str, Any] = {}
    lifespan = Lifespan(wrapped, hc, state)
    gate = Gate(cap=connection_cap(limits.max_connections))
    errors = AcceptErrors()
    listeners = [BatchListener(sock) for sock in socks]

    def stop_listening() -> None:
        for sock in socks:
            sock.close()

    async def connection(stream: trio.SocketStream) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_close_when_cancelled, stream)
                done = nursery.cancel_scope.cancel
                server = _TCPServer(
                    wrapped,
                    hc,
                    context,
                    ConnectionState(state.copy()),
                    stream,
                    closed=done,
                    header_timeout=limits.header_timeout,
                    idle_timeout=limits.idle_timeout,
                )
                await server.run()
                done()
        finally:
            gate.open -= 1

    async def lane(stream: trio.SocketStream) -> None:
        try:
            await _answer_probe(stream, probe, limits.probe_deadline)
        finally:
            gate.lane -= 1

    try:
        async with trio.open_nursery() as lifespan_nursery:
            await lifespan_nursery.start(lifespan.handle_lifespan)
            await lifespan.wait_for_startup()
            async with trio.open_nursery() as connections:
                try:
                    async with trio.open_nursery() as accepting:
                        for listener in listeners:
                            accepting.start_soon(accept_loop, listener, gate, errors, connections, connection, lane)
                        task_status.started([describe(sock) for sock in socks])
                        await shutdown_trigger()
                        accepting.cancel_scope.cancel()
                finally:
                    stop_listening()  # nothing new is accepted while the open connections finish
                    await context.terminated.set()  # idle keep-alive connections close now, none is recycled
                    # Never past the agent's shutdown deadline (``nvdaemon.shutdown``; +inf outside a shutdown).
                    graceful = trio.current_time() + hc.graceful_timeout
                    connections.cancel_scope.deadline = min(graceful, shutdown.deadline())
            await lifespan.wait_for_shutdown()
            lifespan_nursery.cancel_scope.cancel()
    finally:
        stop_listening()


class BatchListener:
    """Accepts every pending connection at once. trio's ``SocketListener`` takes one per scheduler pass, and under
    load a pass is long: a kubelet probe waited in the kernel's queue behind hundreds of reconnecting clients."""

    def __init__(self, sock: socket.socket, batch: int = ACCEPT_BATCH) -> None:
        self.sock = sock
        self.batch = batch

    async def accept(self) -> list[trio.SocketStream]:
        """At least one new connection (a checkpoint per call, not per connection); OSError when the first accept
        fails (EMFILE and the like); a later failure ends the batch and comes back on the next call."""
        while True:
            await trio.lowlevel.wait_readable(self.sock)
            got: list[trio.SocketStream] = []
            try:
                while len(got) < self.batch:
                    conn, _ = self.sock.accept()
                    got.append(trio.SocketStream(trio.socket.from_stdlib_socket(conn)))
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno not in IGNORED_ACCEPT_ERRNOS and not got:
                    raise
            if got:
                return got


class Accepts(Protocol):
    async def accept(self) -> list[trio.SocketStream]: ...


async def accept_loop(
    listener: Accepts,
    gate: Gate,
    errors: AcceptErrors,
    nursery: trio.Nursery,
    serve_one: Callable[[trio.SocketStream], Awaitable[None]],
    serve_lane: Callable[[trio.SocketStream], Awaitable[None]],
) -> None:
    """Accept for ever: under the cap a connection is served, above it the probe lane takes it while it has room,
    and otherwise it is closed at once. Out of descriptors (or kernel memory) the loop waits and retries."""
    while True:
        try:
            streams = await listener.accept()
        except OSError as exc:
            if exc.errno not in CAPACITY_ERRNOS:
                raise
            errors.failed(exc)
            await trio.sleep(ACCEPT_RETRY_SECONDS)
            continue
        errors.succeeded()
        for stream in streams:
            where = gate.admit()
            if where == "serve":
                nursery.start_soon(serve_one, stream)
            elif where == "lane":
                nursery.start_soon(serve_lane, stream)
            else:
                stream.socket.close()


async def _close_when_cancelled(stream: trio.SocketStream) -> None:
    """Close ``stream`` once this task is cancelled: at the end of the graceful timeout, on a cancellation from
    outside, or when the connection has ended by itself (then it is closed already). Hypercorn writes with a
    shielded ``send_all`` that no cancellation reaches; closing the socket wakes it (ClosedResourceError, which
    hypercorn treats as the peer gone), so a peer that never reads cannot hold the server's stop until
    TCP_USER_TIMEOUT."""
    try:
        await trio.sleep_forever()
    finally:
        stream.socket.close()


async def _answer_probe(stream: trio.SocketStream, probe: Probe, deadline: float) -> None:
    """Read one request head; answer a probe path, refuse anything else with 503; close."""
    status, body = 503, b'{"error":"too many connections"}'
    try:
        with trio.move_on_after(deadline) as waited:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = await stream.receive_some(PROBE_HEAD_BYTES)
                if not chunk or len(head) + len(chunk) > PROBE_HEAD_BYTES:
                    return
                head += chunk
        if waited.cancelled_caught:
            return
        method, _, rest = head.partition(b" ")
        target = rest.partition(b" ")[0].partition(b"?")[0]
        if method == b"GET":
            answer = probe(target.decode("latin-1"))
            if answer is not None:
                status, body = answer
        reason = b"OK" if status == 200 else b"Service Unavailable"
        reply = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        with trio.move_on_after(deadline):
            await stream.send_all(reply % (status, reason, len(body)) + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    finally:
        stream.socket.close()
