"""The HTTP server's supervised task (``http``): where it listens, its shutdown trigger, and its re-binding when a
reload changes ``sinks.metrics.listenAddr`` or the ``server`` section.

A reload binds a new address before anything of the new config is applied (``reserve``: an address that cannot be
had rejects the reload, and the running server stays). A restarted server listens before the old one is told to
stop (``Supervisor.replace``), on the reserved sockets, or on dups of the old server's when the address is unchanged,
so no connection is refused meanwhile; the old one then finishes its requests within its graceful timeout. Only a
new address overlapping the old port (``127.0.0.1:P`` -> ``:P``, which the kernel refuses to bind while the old
listener exists) makes the old server stop first.
"""

from __future__ import annotations

import errno
import socket
from functools import partial

import trio

from nvdaemon import shutdown
from nvdaemon.config import ServerConfig
from nvdaemon.server.app import Listening, serve_http
from nvdaemon.supervise import ServeFn, Supervisor, TaskState
from nvdaemon.view import AgentView

TASK_NAME = "http"
HTTP_STOP_SECONDS = 10.0  # a replaced HTTP server's graceful stop (hypercorn's own is at most 5 s), then cancelled

# What ``serve_http`` is given from the config, and so the task's fingerprint: listenAddr, the server section,
# shutdownGraceSeconds (apiTokenFile's content the server re-reads itself).
Settings = tuple[str, ServerConfig, float]


class HttpBinding:
    """The ``http`` task of a supervisor serving ``view``, read only. ``bound`` and ``sockets`` are where it
    listens, as its latest start reported; ``shutdown`` is the running server's graceful stop trigger."""

    def __init__(self, view: AgentView) -> None:
        self._view = view
        self.shutdown = trio.Event()
        self.bound: list[str] = []
        self.sockets: list[socket.socket] = []
        self._reserved: list[socket.socket] | None = None  # a reload's new listenAddr, bound (``reserve``)

    def reserve(self, sup: Supervisor, running_addr: str, addr: str, header_timeout_seconds: float) -> None:
        """Bind (not yet listen on) ``addr`` when it differs from ``running_addr`` and a server runs, and hold the
        sockets for the next ``restart``: no other process can take the address meanwhile. Raises OSError when it
        cannot be had. Nothing is held when the address is unchanged (a restarted server takes over the running
        one's sockets) or overlaps the running one's port (that server is stopped first). Sockets never handed to a
        server are closed when dropped (a reload rejected later)."""
        from nvdaemon.server import listen

        if sup.get(TASK_NAME) is None or addr == running_addr:
            self._reserved = None
            return
        timeout_ms = listen.user_timeout_ms(header_timeout_seconds)
        try:
            self._reserved = listen.bind(addr, user_timeout_ms=timeout_ms, backlog=None)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and listen.overlaps(running_addr, addr):
                self._reserved = None
                return
            raise

    async def start(self, sup: Supervisor, settings: Settings, socks: list[socket.socket] | None) -> None:
        """Start the server with ``settings`` (on ``socks`` when given) and record where it listens."""
        self._record(await sup.start(TASK_NAME, self._serve(settings, socks), critical=True, fingerprint=settings))

    async def restart(self, sup: Supervisor, settings: Settings) -> None:
        """Restart the server if ``settings`` differ from the running one's, on the sockets ``reserve`` holds (they
        are closed when it does not restart)."""
        socks, self._reserved = self._reserved, None
        http = sup.get(TASK_NAME)
        if http is None or http.fingerprint == settings:
            for sock in socks or []:
                sock.close()
            return
        self._record(http.started_value)  # its latest run's sockets (the supervisor may have restarted it)
        running_addr = http.fingerprint[0] if isinstance(http.fingerprint, tuple) else None
        if socks is None and running_addr == settings[0] and all(sock.fileno() != -1 for sock in self.sockets):
            socks = [sock.dup() for sock in self.sockets]
        old_shutdown, self.shutdown = self.shutdown, trio.Event()
        if socks is None:  # the new address needs the old listener gone first
            await _stop(http, old_shutdown)
        serve = self._serve(settings, socks)
        retire = partial(_stop, trigger=old_shutdown)
        self._record(await sup.replace(TASK_NAME, serve, critical=True, fingerprint=settings, retire=retire))

    async def stop(self, sup: Supervisor) -> None:
        """The shutdown's last step: the server stops gracefully, bounded by ``HTTP_STOP_SECONDS`` and the shutdown
        deadline; one in its restart backoff is cancelled, not waited for."""
        http = sup.get(TASK_NAME)
        if http is not None:
            with shutdown.bounded_shield(HTTP_STOP_SECONDS):
                await _stop(http, self.shutdown)

    def _serve(self, settings: Settings, socks: list[socket.socket] | None) -> ServeFn:
        addr, server, grace = settings
        return partial(
            serve_http,
            self._view,
            server,
            addr,
            shutdown_grace_seconds=grace,
            shutdown_trigger=self.shutdown.wait,
            sockets=socks,
        )

    def _record(self, listening: object) -> None:
        """Where the server listens, as it reported when it started (nothing when that start failed)."""
        if isinstance(listening, Listening):
            self.bound, self.sockets = list(listening.bound), list(listening.sockets)


async def _stop(http: TaskState, trigger: trio.Event) -> None:
    """A running server stops gracefully (``trigger``, its shutdown trigger); one in backoff, or one that overruns
    its graceful timeout, is cancelled."""
    if http.state == "running":
        trigger.set()
        with trio.move_on_after(HTTP_STOP_SECONDS):
            await http.done.wait()
    http.scope.cancel()
    await http.done.wait()
