"""The HTTP surface on one port: /metrics, /healthz, /readyz, /v1/state (hypercorn's trio worker + quart-trio).

``/metrics``, ``/healthz`` and ``/readyz`` are always open (kubelet and Prometheus must reach them); ``/v1/*`` is
guarded by a bearer token when ``server.apiTokenFile`` is set, compared in constant time. Every error is JSON.
Request bodies and header reading are bounded so a misbehaving client cannot hold memory or a connection.
"""

from __future__ import annotations

import hmac
import logging
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from quart import Response, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from nvdaemon.server import history_routes, stream_routes
from nvdaemon.server.listen import bind_list
from nvdaemon.server.metrics import CONTENT_TYPE, MetricsCache
from nvdaemon.server.responses import json_response
from nvdaemon.server.state import state_samples, status_document

if TYPE_CHECKING:
    from nvdaemon.app import Agent

log = logging.getLogger(__name__)


def read_token(path: str) -> bytes | None:
    """The API token, or None when no token file is configured. Surrounding whitespace (a trailing newline from
    ``echo > file``) is not part of the token."""
    if not path:
        return None
    token = Path(path).read_bytes().strip()
    if not token:
        raise ValueError(f"server.apiTokenFile {path} is empty")
    return token


def build_app(agent: Agent) -> QuartTrio:
    app = QuartTrio("nvdaemon")
    app.config["MAX_CONTENT_LENGTH"] = agent.loaded.config.server.max_request_bytes
    app.config["BODY_TIMEOUT"] = max(1, round(agent.loaded.config.server.header_timeout_seconds))
    metrics = MetricsCache(agent)
    token = read_token(agent.loaded.config.server.api_token_file)

    def authorized(path: str, given: str) -> bool:
        if token is None or not path.startswith("/v1/"):
            return True
        scheme, _, value = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token)

    @app.before_request
    async def guard() -> Response | None:
        if not authorized(request.path, request.headers.get("Authorization", "")):
            return json_response({"error": "unauthorized"}, 401)
        return None

    @app.before_websocket
    async def guard_websocket() -> Response | None:  # refused with HTTP 401 before the upgrade
        if not authorized(websocket.path, websocket.headers.get("Authorization", "")):
            return json_response({"error": "unauthorized"}, 401)
        return None

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(metrics.render(), content_type=CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz() -> Response:
        problems = agent.health_problems()
        return json_response({"status": "fail" if problems else "ok", "problems": problems}, 503 if problems else 200)

    @app.get("/readyz")
    async def readyz() -> Response:
        # Ready once every active tier has published a snapshot: a tier task that failed at start (and is being
        # restarted by the supervisor) must not let the pod count as serving its metrics.
        waiting = [t for t in agent.active_tiers() if t not in agent.snapshots]
        if agent.ready and not waiting and not agent.stopping.is_set():
            return json_response({"status": "ready"}, 200)
        if agent.stopping.is_set():
            return json_response({"status": "stopping"}, 503)
        return json_response({"status": "starting", "waitingForTiers": waiting}, 503)

    @app.get("/v1/state")
    async def v1_state() -> Response:
        return json_response(state_samples(agent), 200)

    @app.get("/v1/status")
    async def v1_status() -> Response:
        return json_response(status_document(agent), 200)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        return json_response({"error": (exc.name or "error").lower(), "status": code}, code)

    stream_routes.register(app, agent)
    history_routes.register(app, agent)
    return app


class _HypercornConfig(HypercornConfig):
    """Listening sockets with TCP_USER_TIMEOUT (inherited by accepted ones): a peer that leaves sent data
    unacknowledged, or keeps its receive window shut, for that long is aborted by the kernel. Hypercorn writes with
    a shielded ``send_all``; without this a websocket client that stops reading would hold its connection, and the
    agent's shutdown, for ever."""

    user_timeout_ms = 0

    def create_sockets(self) -> Any:
        sockets = super().create_sockets()
        for sock in sockets.insecure_sockets:
            if self.user_timeout_ms and sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, self.user_timeout_ms)
        return sockets


async def serve_http(agent: Agent, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve until ``agent.http_shutdown`` is set (hypercorn's own graceful stop, not a cancellation)."""
    cfg = agent.loaded.config
    hc = _HypercornConfig()
    hc.bind = bind_list(cfg.sinks.metrics.listen_addr)  # ":PORT": every interface, as in Go
    hc.accesslog = None
    hc.errorlog = logging.getLogger("nvdaemon.http")
    hc.graceful_timeout = min(5.0, cfg.shutdown_grace_seconds / 2)
    # Slow clients. Until a request's head is complete hypercorn's idle timer (keep_alive_timeout) runs, so a client
    # dribbling headers is cut off after headerTimeoutSeconds; the same timer closes idle keep-alive connections.
    # read_timeout stays off: it wraps every socket read, so it would also cut /v1/events websocket clients that have
    # nothing to say. A stalled request body is bounded by BODY_TIMEOUT (build_app), and a peer that stops reading
    # what we send, or acknowledging it, is cut off by the kernel (TCP_USER_TIMEOUT, _HypercornConfig).
    limit = max(1, round(cfg.server.header_timeout_seconds))
    hc.read_timeout = None
    hc.keep_alive_timeout = limit
    hc.user_timeout_ms = limit * 1000
    hc.h11_max_incomplete_size = 16 * 1024
    hc.include_server_header = False
    app = build_app(agent)
    shutdown = agent.http_shutdown

    async def bound(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        await serve(app, hc, shutdown_trigger=shutdown.wait, task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(bound)
        agent.bound = list(binds)
        log.info("listening on %s", ", ".join(binds))
        task_status.started()
