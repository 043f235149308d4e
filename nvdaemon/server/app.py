"""The HTTP surface on one port: /metrics, /healthz, /readyz, /v1/state, /v1/status, /v1/events, /v1/history and
``/``, the node page for people (hypercorn's trio worker + quart-trio, HTTP/1.1 only).

``/metrics``, ``/healthz`` and ``/readyz`` are always open (kubelet and Prometheus must reach them), and so is ``/``
(static, no data: ``nvdaemon/server/node_page.py``); ``/v1/*`` is guarded by a bearer token when
``server.apiTokenFile`` is set (or, on a websocket, the token subprotocol a browser can send), compared in constant
time; that file (at most ``MAX_TOKEN_BYTES``, 8 KiB) is stat'ed on every guarded request and re-read when it
changes, or at least every second (``ApiToken``). Every error is JSON. Request bodies (maxRequestBytes), request
heads (headerTimeoutSeconds, 16 KiB), idle keep-alive connections (idleTimeoutSeconds), open connections
(maxConnections) and inbound websocket messages (maxWebsocketMessageBytes) are bounded so a misbehaving client cannot
hold memory, descriptors or a connection; ``nvdaemon/server/accept.py`` and ``nvdaemon/server/asgi.py`` say how.
"""

from __future__ import annotations

import hmac
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from hypercorn.config import Config as HypercornConfig
from quart import Response, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from nvdaemon.server import accept, asgi, history_routes, listen, node_page, stream_routes
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.server.render_ahead import serve_render_ahead
from nvdaemon.server.responses import json_response
from nvdaemon.server.state import state_samples, status_document
from nvdaemon.server.token import ApiToken, bearer_from_subprotocols

if TYPE_CHECKING:
    from nvdaemon.config import ServerConfig
    from nvdaemon.view import AgentView

log = logging.getLogger(__name__)

GRACEFUL_MAX_SECONDS = 5.0  # hypercorn's graceful stop: at most this, and at most half of shutdownGraceSeconds


@dataclass(frozen=True)
class Listening:
    """What ``serve_http`` reports once it accepts connections: its URLs (``http://HOST:PORT``, the real port when
    ``:0`` was asked for) and its listening sockets (a restarted server can take over dups of them)."""

    bound: tuple[str, ...]
    sockets: tuple[socket.socket, ...]


def health(view: AgentView) -> tuple[dict[str, Any], int]:
    problems = view.health_problems()
    # The tick counts let a person (or a test) see the loops advance between two probes; kubelet reads the code.
    body = {"status": "fail" if problems else "ok", "problems": problems, "ticks": dict(sorted(view.ticks.items()))}
    return body, 503 if problems else 200


def readiness(view: AgentView) -> tuple[dict[str, Any], int]:
    # Ready once every active tier has published a snapshot: a tier task that failed at start (and is being
    # restarted by the supervisor) must not let the pod count as serving its metrics.
    waiting = [t for t in view.active_tiers() if t not in view.snapshots]
    if view.ready and not waiting and not view.stopping.is_set():
        return {"status": "ready"}, 200
    if view.stopping.is_set():
        return {"status": "stopping"}, 503
    return {"status": "starting", "waitingForTiers": waiting}, 503


PROBES = {"/healthz": health, "/readyz": readiness}


def build_app(view: AgentView, server_config: ServerConfig, metrics: MetricsCache | None = None) -> QuartTrio:
    """The quart-trio app over ``view``, bounded by ``server_config`` (``server``: request body size and time; the
    token file ``apiTokenFile``, read by ``ApiToken`` on guarded requests); ``metrics``: the /metrics cache, shared
    with the fast path in front of the app (``serve_http``)."""
    app = QuartTrio("nvdaemon")
    app.config["MAX_CONTENT_LENGTH"] = server_config.max_request_bytes
    app.config["BODY_TIMEOUT"] = max(1, round(server_config.header_timeout_seconds))
    metrics = metrics or MetricsCache(view)
    token_file = server_config.api_token_file
    api_token = ApiToken(token_file) if token_file else None

    def authorized(path: str, given: str, subprotocol_token: str | None = None) -> bool:
        if api_token is None or not path.startswith("/v1/"):
            return True
        token = api_token.current()
        scheme, _, value = given.partition(" ")
        if not given and subprotocol_token is not None:  # a browser's websocket (nvdaemon/server/token.py)
            scheme, value = "bearer", subprotocol_token
        return token is not None and scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token)

    @app.before_request
    async def guard() -> Response | None:
        if not authorized(request.path, request.headers.get("Authorization", "")):
            return json_response({"error": "unauthorized"}, 401)
        return None

    @app.before_websocket
    async def guard_websocket() -> Response | None:  # refused with HTTP 401 before the upgrade
        offered = bearer_from_subprotocols(websocket.requested_subprotocols)
        if not authorized(websocket.path, websocket.headers.get("Authorization", ""), offered):
            return json_response({"error": "unauthorized"}, 401)
        return None

    @app.get("/metrics")
    async def get_metrics() -> Response:
        # HEAD comes here (GET is answered in front of quart, serve_http): the same headers, Content-Length that of
        # the body a GET would get (gzipped when accepted), no body.
        headers, body = metrics.answer(request.headers.getlist("Accept-Encoding"))
        return Response(body, headers={k.decode(): v.decode() for k, v in headers})

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response(*health(view))

    @app.get("/readyz")
    async def readyz() -> Response:
        return json_response(*readiness(view))

    @app.get("/v1/state")
    async def v1_state() -> Response:
        return json_response(state_samples(view), 200)

    @app.get("/v1/status")
    async def v1_status() -> Response:
        return json_response(status_document(view), 200)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        return json_response({"error": (exc.name or "error").lower(), "status": code}, code)

    stream_routes.register(app, view)
    history_routes.register(app, view)
    node_page.register(app)
    return app


async def serve_http(
    view: AgentView,
    server_config: ServerConfig,
    listen_addr: str,
    *,
    shutdown_grace_seconds: float,
    shutdown_trigger: Callable[[], Awaitable[None]],
    sockets: list[socket.socket] | None = None,
    task_status: trio.TaskStatus[Listening] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``view`` on ``listen_addr`` (``sinks.metrics.listenAddr``; ``:PORT`` is every interface, as in Go)
    under ``server_config`` until ``shutdown_trigger`` returns (hypercorn's own graceful stop, at most
    ``GRACEFUL_MAX_SECONDS`` and half of ``shutdown_grace_seconds``; a cancellation stops it at once). Reports
    ``Listening`` through ``task_status.started`` once it accepts connections, in the manner of hypercorn's
    ``worker_serve``; it writes nothing anywhere else.

    ``sockets``: listening sockets bound by the caller (a reload binds the new address first, or dups the running
    server's sockets, so that the port is never closed in between); this server closes them when it stops. Without
    them, or when they are already closed (the supervisor restarting this task after a failure), it binds
    ``listen_addr`` itself."""
    s = server_config
    hc = HypercornConfig()
    hc.accesslog = None
    hc.errorlog = logging.getLogger("nvdaemon.http")
    hc.graceful_timeout = min(GRACEFUL_MAX_SECONDS, shutdown_grace_seconds / 2)
    # Slow clients. A request head must be complete within headerTimeoutSeconds (of the connection's start, or of
    # its first byte after an idle spell) and an idle keep-alive connection is closed after idleTimeoutSeconds, on
    # the first request and every later one: two timers where hypercorn has one, keep_alive_timeout, which is left
    # unread (accept._TCPServer says why; nvdaemon/server/asgi.py why it had stopped after the first response under
    # quart-trio).
    # read_timeout stays off: it wraps every socket read, so it would also cut /v1/events websocket clients that
    # have nothing to say. A stalled request body is bounded by BODY_TIMEOUT (build_app), and a peer that stops
    # reading what we send, or acknowledging it, is cut off by the kernel (TCP_USER_TIMEOUT, listen.bind), after
    # headerTimeoutSeconds.
    hc.read_timeout = None
    hc.h11_max_incomplete_size = 16 * 1024
    hc.websocket_max_message_size = s.max_websocket_message_bytes
    hc.include_server_header = False
    limits = accept.Limits(
        max_connections=s.max_connections,
        probe_deadline=min(1.0, s.header_timeout_seconds),
        header_timeout=s.header_timeout_seconds,
        idle_timeout=s.idle_timeout_seconds,
    )

    def probe(path: str) -> tuple[int, bytes] | None:
        answer = PROBES.get(path)
        if answer is None:
            return None
        body, status = answer(view)
        return status, msgspec.json.encode(body)

    asgi.install()
    metrics = MetricsCache(view)  # GET /metrics is answered in front of quart; HEAD and the rest go through it
    pages = {"/metrics": metrics.page}
    app = asgi.front(build_app(view, server_config, metrics=metrics), probe, pages)
    user_timeout = listen.user_timeout_ms(s.header_timeout_seconds)
    socks = sockets
    if not socks or any(sock.fileno() == -1 for sock in socks):
        for sock in socks or []:
            sock.close()
        socks = listen.bind(listen_addr, user_timeout_ms=user_timeout)
    else:
        for sock in socks:  # sockets taken over keep the options they were bound with; a reserved one listens now
            listen.set_user_timeout(sock, user_timeout)
            sock.listen(listen.BACKLOG)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(serve_render_ahead, view, metrics))

        async def serve_then_stop_rendering(*, task_status: trio.TaskStatus[list[str]]) -> None:
            await accept.serve(
                app, hc, socks, limits=limits, probe=probe, shutdown_trigger=shutdown_trigger, task_status=task_status
            )
            nursery.cancel_scope.cancel()  # the server has stopped: nobody is left to render ahead for

        bound = await nursery.start(serve_then_stop_rendering)
        log.info("listening on %s", ", ".join(bound))
        task_status.started(Listening(tuple(bound), tuple(socks)))
