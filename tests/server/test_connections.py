"""Connection lifetimes on a real server in process: idle keep-alive connections close, ``Connection: close`` is
honoured, every request's head is bounded in time (not only the first), and the connection cap leaves the probes
answering while every slot is held."""

from __future__ import annotations

import json
import logging
import resource
import socket
from pathlib import Path

import pytest
import trio
import trio.testing
from quart_trio import QuartTrio

from nvdaemon.collectors.heldfiles import held_cap
from nvdaemon.config import ServerConfig
from nvdaemon.server import app as server_app
from nvdaemon.server.accept import FD_RESERVE, PROBE_LANE, AcceptErrors, Gate, accept_loop, connection_cap
from nvdaemon.server.asgi import WORK_SLOTS
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.view import AgentView
from tests.server.raw import Conn, make_server_view, serving

DEADLINE = 15  # seconds before a test gives up on an expected close; never a measured duration


async def test_idle_keep_alive_connection_is_closed_after_a_response(tmp_path: Path) -> None:
    view = make_server_view(tmp_path, "{idleTimeoutSeconds: 1, headerTimeoutSeconds: 30}")
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        for _ in range(2):  # still a keep-alive connection after the first response
            status, headers, _ = await conn.get("/readyz")
            assert status == 503 and headers.get("connection", "") != "close"
        with trio.fail_after(DEADLINE):
            assert await conn.closed_by_server() == b""


async def test_idle_keep_alive_connection_outlives_the_header_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Idle and head reading have a timer each: Prometheus, which keeps its connection from scrape to scrape, finds it
    # still open a scrape interval later (virtual time: the clock jumps to each timer's deadline).
    view = make_server_view(tmp_path, "{idleTimeoutSeconds: 60, headerTimeoutSeconds: 1}")
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        assert (await conn.get("/readyz"))[0] == 503
        await trio.sleep(30)  # 30 header timeouts, half the idle one
        assert (await conn.get("/readyz"))[0] == 503  # the same connection
        idle_since = trio.current_time()
        assert await conn.closed_by_server() == b""
        assert 60 <= trio.current_time() - idle_since < 61


async def test_pipelined_partial_head_is_due_within_the_header_timeout(tmp_path: Path) -> None:
    # The next request's first bytes came with the last one: the connection is not idle once that response is sent.
    view = make_server_view(tmp_path, "{headerTimeoutSeconds: 1, idleTimeoutSeconds: 60}")
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        await conn.send(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n")
        assert (await conn.response())[0] == 503
        with trio.fail_after(DEADLINE):  # long before the 60 s idle timer
            assert await conn.closed_by_server() == b""


@pytest.mark.parametrize(
    ("headers", "version"), [("Connection: close\r\n", "1.1"), ("", "1.0")], ids=["connection-close", "http-1.0"]
)
async def test_connection_close_is_honoured(tmp_path: Path, headers: str, version: str) -> None:
    view = make_server_view(tmp_path, "{idleTimeoutSeconds: 60, headerTimeoutSeconds: 60}")
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        status, _, body = await conn.get("/readyz", headers, version)
        assert status == 503 and json.loads(body)["status"] == "starting"
        with trio.fail_after(DEADLINE):  # long before the 60 s timers
            assert await conn.closed_by_server() == b""


async def test_slow_second_request_head_is_cut_off(tmp_path: Path) -> None:
    view = make_server_view(tmp_path, "{headerTimeoutSeconds: 1, idleTimeoutSeconds: 60}")
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        assert (await conn.get("/readyz"))[0] == 503
        await trio.testing.wait_all_tasks_blocked()  # the server has gone idle: its idle timer (60 s) runs
        await conn.send(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")  # the second head never completes
        with trio.fail_after(DEADLINE):
            assert await conn.closed_by_server() == b""


async def test_connection_cap_answers_probes_and_refuses_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    view = make_server_view(tmp_path, "{maxConnections: 3, headerTimeoutSeconds: 60, idleTimeoutSeconds: 60}")
    caplog.set_level(logging.WARNING, logger="nvdaemon.server.accept")
    async with serving(view) as (host, port):
        held = [await Conn.open(host, port) for _ in range(3)]
        for conn in held:  # served (so surely accepted), then kept open
            assert (await conn.get("/readyz"))[0] == 503
        with trio.fail_after(DEADLINE):
            probe = await Conn.open(host, port)
            status, headers, body = await probe.get("/healthz")
            assert status in (200, 503) and "problems" in json.loads(body)
            assert headers["connection"] == "close"
            other = await Conn.open(host, port)
            status, _, body = await other.get("/metrics")
            assert status == 503 and json.loads(body) == {"error": "too many connections"}
            assert await other.closed_by_server() == b""
        # A slot frees when a held connection goes: /metrics is served again.
        await held.pop().aclose()
        with trio.fail_after(DEADLINE):
            while True:
                conn = await Conn.open(host, port)
                status, _, body = await conn.get("/metrics")
                if status == 200:
                    break
                await conn.aclose()
                await trio.sleep(0.05)
        assert b"nodevitals_" in body
        messages = [r.getMessage() for r in caplog.records if r.name == "nvdaemon.server.accept"]
        assert sum("connection cap 3 reached" in m for m in messages) == 1  # once, not per refused connection
        assert any("below the cap again" in m for m in messages)
        for c in [*held, conn, probe]:
            await c.aclose()


def test_the_connection_cap_leaves_descriptors_for_the_held_pseudo_files() -> None:
    """Under a soft RLIMIT_NOFILE of 1024: an eighth for the collectors' held files (``heldfiles.held_cap``), the
    reserve and the probe lane, and the rest for connections; every one of them fits under the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    try:
        assert held_cap() == 128
        cap = connection_cap(100_000)
        assert cap == 1024 - FD_RESERVE - PROBE_LANE - 128
        assert cap + PROBE_LANE + held_cap() + FD_RESERVE <= 1024
        assert connection_cap(10) == 10
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class FlakyListener:
    """accept() fails with EMFILE ``failures`` times, then blocks for ever."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def accept(self) -> list[trio.SocketStream]:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(24, "Too many open files")
        await trio.sleep_forever()
        raise AssertionError


async def test_accept_out_of_descriptors_is_logged_once_per_burst(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    listener = FlakyListener(failures=50)
    errors = AcceptErrors()

    async def never(stream: trio.SocketStream) -> None:
        raise AssertionError("nothing was accepted")

    with caplog.at_level(logging.WARNING, logger="nvdaemon.server.accept"):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept_loop, listener, Gate(cap=1), errors, nursery, never, never)
            await trio.sleep(60)
            nursery.cancel_scope.cancel()
    assert listener.calls == 51  # it kept retrying, with a pause between tries
    assert errors.total == 50
    failures = [r for r in caplog.records if "accept failed" in r.getMessage()]
    assert len(failures) == 1 and "Too many open files" in failures[0].getMessage()
    assert PROBE_LANE > 0


async def test_probes_answer_while_every_work_slot_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Requests other than the probes take one of WORK_SLOTS until their response starts (so a pass of the
    scheduler stays short under load); the probes never wait for one."""
    release = trio.Event()
    real_build_app = server_app.build_app

    def build_app_with_a_stuck_route(
        view: AgentView, server_config: ServerConfig, metrics: MetricsCache | None = None
    ) -> QuartTrio:
        app = real_build_app(view, server_config, metrics)

        @app.get("/v1/stuck")
        async def stuck() -> str:
            await release.wait()
            return "done"

        return app

    monkeypatch.setattr(server_app, "build_app", build_app_with_a_stuck_route)
    view = make_server_view(tmp_path, "{headerTimeoutSeconds: 60, idleTimeoutSeconds: 60}")
    async with serving(view) as (host, port):
        stuck = [await Conn.open(host, port) for _ in range(WORK_SLOTS)]
        for conn in stuck:
            await conn.send(b"GET /v1/stuck HTTP/1.1\r\nHost: x\r\n\r\n")
        waiting = await Conn.open(host, port)
        await waiting.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        with trio.fail_after(DEADLINE):
            for path in ("/healthz", "/readyz"):
                probe = await Conn.open(host, port)
                status, _, body = await probe.get(path)
                assert status in (200, 503) and "status" in json.loads(body)
        with trio.move_on_after(0.5):
            await waiting.response()
            raise AssertionError("/metrics was answered while every work slot was held")
        release.set()
        with trio.fail_after(DEADLINE):
            assert (await waiting.response())[0] == 200
            for conn in stuck:
                assert (await conn.response())[2] == b"done"


async def test_shutdown_ends_a_connection_whose_peer_never_reads(tmp_path: Path) -> None:
    """Hypercorn writes with a shielded send_all, which neither the graceful timeout nor a cancellation ends; only
    the kernel would, after TCP_USER_TIMEOUT (headerTimeoutSeconds, 120 s here). The server's stop must not wait
    for it: at the end of the graceful timeout the connection is closed under the blocked write."""
    view = make_server_view(
        tmp_path, "{headerTimeoutSeconds: 120, idleTimeoutSeconds: 120}", "shutdownGraceSeconds: 1\n"
    )
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    gave_up: list[bool] = []

    async def give_up() -> None:  # ends the test's wait if the server does not stop; closing resets the connection
        await trio.sleep(DEADLINE)
        gave_up.append(True)
        sock.close()

    async with trio.open_nursery() as watchdog:
        async with serving(view) as (host, port):
            await sock.connect((host, port))
            client = trio.SocketStream(sock)
            pipelined = b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n" * 2000  # answers fill every buffer, unread
            stalled = False
            while not stalled:
                with trio.move_on_after(1) as waited:
                    await client.send_all(pipelined)
                stalled = waited.cancelled_caught  # the server stopped reading: its own write is blocked
            watchdog.start_soon(give_up)
        watchdog.cancel_scope.cancel()  # leaving `serving` stopped the server
    sock.close()
    assert not gave_up, "the server's stop waited for a peer that never reads"


async def test_http2_is_not_spoken(tmp_path: Path) -> None:
    """Only HTTP/1.1, as the Go agent's server: hypercorn would switch a plaintext connection to HTTP/2 on the
    prior-knowledge preface or on ``Upgrade: h2c``, and then take 100 requests at once on it, with 64 KiB heads."""
    view = make_server_view(tmp_path, "{headerTimeoutSeconds: 60, idleTimeoutSeconds: 60}")
    async with serving(view) as (host, port):
        upgrade = await Conn.open(host, port)
        with trio.fail_after(DEADLINE):
            status, headers, body = await upgrade.get(
                "/metrics",
                "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
            )
        assert status == 200 and headers.get("upgrade") is None and b"nodevitals_" in body
        preface = await Conn.open(host, port)
        await preface.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        with trio.fail_after(DEADLINE):
            answer = await preface.closed_by_server()
        assert answer.startswith(b"HTTP/1.1 4"), answer[:200]  # an HTTP/1.1 error, not HTTP/2 SETTINGS
