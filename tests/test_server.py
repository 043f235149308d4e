"""The HTTP surface, in process, over a fake read-only view (no agent): routes through quart-trio's test client,
limits and binds through a real socket on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from pathlib import Path

import pytest
import trio
import trio.testing
from quart_trio import QuartTrio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.model import CollectorStatus, Kind, Sample, TierSnapshot, make_labels
from nvdaemon.server.app import Listening, build_app
from nvdaemon.supervise import Supervisor
from tests.server.fakeview import FakeView, address, as_view, make_view, serve


def make_config_text(tmp_path: Path, extra: str = "") -> str:
    return f"node: n1\nstateDir: {tmp_path / 'state'}\nintervalSeconds: 10\n{extra}"


def app_of(view: FakeView) -> QuartTrio:
    return build_app(as_view(view), view.loaded.config.server)


def add_snapshot(view: FakeView, value: float = 3.5) -> None:
    samples = [
        Sample("load1", "cpu", value, timestamp=1.0),
        Sample("psi_stall_seconds_total", "io", 12.5, Kind.COUNTER, make_labels({"share": "some"}), timestamp=1.0),
    ]
    status = CollectorStatus("loadavg", success=True, samples=2)
    view.take(TierSnapshot("core", samples, {"loadavg": status}, collected_at=1.0, duration=0.01))


async def test_metrics_exposition_and_cache(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    add_snapshot(view)
    client = app_of(view).test_client()
    resp = await client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = await resp.get_data(as_text=True)
    assert 'nodevitals_hw_load1{device="cpu",node="n1",tier="core"} 3.5' in text
    assert 'nodevitals_hw_psi_stall_seconds_total{device="io",node="n1",share="some",tier="core"} 12.5' in text
    assert "# TYPE nodevitals_hw_psi_stall_seconds_total counter" in text
    assert 'nodevitals_collector_success{collector="loadavg"} 1.0' in text
    assert "process_resident_memory_bytes" in text
    # Served from the cache until the snapshot changes, then re-rendered once.
    again = await (await client.get("/metrics")).get_data(as_text=True)
    assert again == text
    add_snapshot(view, value=7.25)
    fresh = await (await client.get("/metrics")).get_data(as_text=True)
    assert 'nodevitals_hw_load1{device="cpu",node="n1",tier="core"} 7.25' in fresh


async def test_no_total_suffix_is_ever_appended(tmp_path: Path) -> None:
    """A counter sample named without ``_total`` is exposed under its own name, as a gauge (prometheus_client would
    otherwise append ``_total``: the Go agent's smart_power_on_hours must not become smart_power_on_hours_total)."""
    view = make_view(tmp_path)
    samples = [
        Sample("smart_power_on_hours", "sda", 12345.0, Kind.COUNTER, tier="smart", timestamp=1.0),
        Sample("nvme_bytes_read_total", "nvme0n1", 5.0, Kind.GAUGE, tier="smart", timestamp=1.0),
    ]
    view.take(TierSnapshot("smart", samples, {}, collected_at=1.0, duration=0.01))
    text = await (await app_of(view).test_client().get("/metrics")).get_data(as_text=True)
    assert "# TYPE nodevitals_hw_smart_power_on_hours gauge" in text
    assert 'nodevitals_hw_smart_power_on_hours{device="sda",node="n1",tier="smart"} 12345.0' in text
    assert "smart_power_on_hours_total" not in text
    assert "# TYPE nodevitals_hw_nvme_bytes_read_total gauge" in text
    assert 'nodevitals_hw_nvme_bytes_read_total{device="nvme0n1",node="n1",tier="smart"} 5.0' in text


async def test_state_is_the_go_sample_array(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    client = app_of(view).test_client()
    resp = await client.get("/v1/state")
    assert (resp.status_code, json.loads(await resp.get_data())) == (200, [])  # nothing collected yet
    add_snapshot(view)
    gpu = [
        Sample("gpu_temperature_celsius", "gpu0", 61.0, labels=make_labels({"gpu_uuid": "GPU-0"}), timestamp=2.25),
        Sample("gpu_power_watts", "gpu0", math.nan, timestamp=0.0),  # no timestamp of its own: the snapshot's
    ]
    view.take(TierSnapshot("gpu", gpu, {}, collected_at=1_767_323_045.5, duration=0.01))
    resp = await client.get("/v1/state")
    assert resp.headers["Content-Type"] == "application/json"
    # Go's model.Sample, field for field and in its order: kind left out for a gauge, labels when empty.
    assert json.loads(await resp.get_data(), object_pairs_hook=list) == [
        [("node", "n1"), ("tier", "core"), ("device", "cpu"), ("metric", "load1"), ("value", 3.5),
         ("timestamp", "1970-01-01T00:00:01Z")],
        [("node", "n1"), ("tier", "core"), ("device", "io"), ("metric", "psi_stall_seconds_total"),
         ("kind", "counter"), ("value", 12.5), ("labels", [("share", "some")]), ("timestamp", "1970-01-01T00:00:01Z")],
        [("node", "n1"), ("tier", "gpu"), ("device", "gpu0"), ("metric", "gpu_temperature_celsius"), ("value", 61.0),
         ("labels", [("gpu_uuid", "GPU-0")]), ("timestamp", "1970-01-01T00:00:02.25Z")],
        [("node", "n1"), ("tier", "gpu"), ("device", "gpu0"), ("metric", "gpu_power_watts"), ("value", None),
         ("timestamp", "2026-01-02T03:04:05.5Z")],
    ]  # fmt: skip


async def test_status_document(tmp_path: Path) -> None:
    view = make_view(tmp_path, "rules: [{metric: load1, condition: load_high, threshold: 3}]\n")
    add_snapshot(view)
    resp = await app_of(view).test_client().get("/v1/status")
    doc = json.loads(await resp.get_data())
    assert doc["node"] == "n1"
    assert doc["tiers"]["core"]["samples"] == 2 and doc["tiers"]["core"]["ticks"] == 1
    assert doc["tiers"]["core"]["collectors"]["loadavg"]["success"] is True
    assert doc["conditions"][0]["condition"] == "load_high" and doc["conditions"][0]["stale"] is False
    assert doc["recentEvents"][0]["phase"] == "ENTER"
    assert doc["eventSeq"] == 1
    assert "samples" not in doc  # they are /v1/state's


async def test_json_errors_for_unknown_paths_and_methods(tmp_path: Path) -> None:
    client = app_of(make_view(tmp_path)).test_client()
    resp = await client.get("/nope")
    assert resp.status_code == 404
    assert json.loads(await resp.get_data()) == {"error": "not found", "status": 404}
    resp = await client.delete("/metrics")
    assert resp.status_code == 405
    assert resp.headers["Content-Type"] == "application/json"


async def test_api_token_guards_v1_only(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token-value\n")
    view = make_view(tmp_path, f"server: {{apiTokenFile: {token}}}\n")
    client = app_of(view).test_client()
    for path in ("/v1/state", "/v1/status", "/v1/history/load1"):
        assert (await client.get(path)).status_code == 401
        wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert json.loads(await wrong.get_data()) == {"error": "unauthorized"}
    for path, status in (("/v1/state", 200), ("/v1/status", 200), ("/v1/history/load1", 404)):
        ok = await client.get(path, headers={"Authorization": "Bearer s3cret-token-value"})
        assert ok.status_code == status
        assert b"s3cret" not in await ok.get_data()
    for open_path in ("/metrics", "/healthz", "/readyz"):
        assert (await client.get(open_path)).status_code != 401


async def test_healthz_answers_the_problems_the_view_reports(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    client = app_of(view).test_client()
    resp = await client.get("/healthz")
    assert (resp.status_code, json.loads(await resp.get_data())) == (200, {"status": "ok", "problems": [], "ticks": {}})
    view.update(problems=["tier core: no completed tick for 31s"], ticks={"smart": 2, "core": 7})
    resp = await client.get("/healthz")
    body = {"status": "fail", "problems": ["tier core: no completed tick for 31s"], "ticks": {"core": 7, "smart": 2}}
    assert (resp.status_code, json.loads(await resp.get_data())) == (503, body)


async def test_health_problems_reflect_loops_not_hardware(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """What the agent gives /healthz (its view's ``health_problems``): stuck tier loops and critical tasks."""
    agent = Agent(parse_config(make_config_text(tmp_path), "test.yaml", env={}))
    agent.started_clock = trio.current_time()
    agent.heartbeats["core"] = trio.current_time()
    # A collector that fails (broken hardware) does not make the agent unhealthy.
    status = CollectorStatus("hwmon", success=False, errors=["EIO"])
    agent.on_snapshot(TierSnapshot("core", [], {"hwmon": status}, collected_at=time.time(), duration=0))
    assert agent.health_problems() == []
    await trio.sleep(30.5)  # 3 intervals of 10 s, and less than the second a tick may wait for the spool
    assert agent.health_problems() == []
    await trio.sleep(1.5)  # more than 3 intervals of 10 s plus that second without a tick
    assert agent.health_problems() == ["tier core: no completed tick for 32s"]
    agent.heartbeats["core"] = trio.current_time()
    assert agent.health_problems() == []

    async def broken(task_status: trio.TaskStatus[None]) -> None:
        raise RuntimeError("cannot bind")

    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery, stuck_after=3)
        await agent.supervisor.start("http", broken, critical=True)
        await trio.sleep(60)
        agent.heartbeats["core"] = trio.current_time()
        assert agent.health_problems() == ["task http: failing repeatedly"]
        nursery.cancel_scope.cancel()


async def test_readyz_until_ready_and_while_stopping(tmp_path: Path) -> None:
    view = make_view(tmp_path)
    client = app_of(view).test_client()
    assert (await client.get("/readyz")).status_code == 503
    view.update(ready=True)
    # Started, but the core tier has not published a snapshot (its task failed at start and is restarting).
    resp = await client.get("/readyz")
    assert resp.status_code == 503
    assert json.loads(await resp.get_data()) == {"status": "starting", "waitingForTiers": ["core"]}
    view.take(TierSnapshot("core", [], {}, collected_at=time.time(), duration=0))
    assert (await client.get("/readyz")).status_code == 200
    view.stopping.set()
    assert (await client.get("/readyz")).status_code == 503


async def test_serve_http_reports_its_binds_through_nursery_start(tmp_path: Path) -> None:
    """``127.0.0.1:0`` asked for: the real port is reported, with the socket listening on it, and the server
    answers there; it writes nothing to its view (the fake refuses any assignment)."""
    view = make_view(tmp_path, "sinks: {metrics: {listenAddr: '127.0.0.1:0'}}\n")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        listening = await nursery.start(serve(view, stop))
        assert isinstance(listening, Listening)
        host, port = address(listening)
        assert (host, len(listening.bound)) == ("127.0.0.1", 1) and port != 0
        assert [sock.getsockname() for sock in listening.sockets] == [("127.0.0.1", port)]
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some():
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 503") and b'"waitingForTiers":["core"]' in reply
        stop.set()
    assert all(sock.fileno() == -1 for sock in listening.sockets)  # closed when it stopped


async def _serve(view: FakeView, stop: trio.Event, nursery: trio.Nursery) -> tuple[str, int]:
    return address(await nursery.start(serve(view, stop)))


@pytest.mark.parametrize("header_bytes", [64 * 1024])
async def test_oversized_headers_are_refused(tmp_path: Path, header_bytes: int) -> None:
    view = make_view(tmp_path, "sinks: {metrics: {listenAddr: '127.0.0.1:0'}}\n")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await _serve(view, stop, nursery)
        stream = await trio.open_tcp_stream(host, port)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * header_bytes + b"\r\n\r\n"
        reply = b""
        with trio.fail_after(10):
            # The server may close before reading it all: that is a refusal too.
            with contextlib.suppress(trio.BrokenResourceError):
                await stream.send_all(request)
            while chunk := await stream.receive_some():
                reply += chunk
        assert not reply.startswith(b"HTTP/1.1 200")
        stop.set()


async def test_slow_headers_are_cut_off(tmp_path: Path) -> None:
    view = make_view(tmp_path, "sinks: {metrics: {listenAddr: '127.0.0.1:0'}}\nserver: {headerTimeoutSeconds: 1}\n")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        host, port = await _serve(view, stop, nursery)
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finishes the headers
        began = trio.current_time()
        with trio.fail_after(10):
            while await stream.receive_some():
                pass
        assert trio.current_time() - began < 5
        stop.set()


async def test_request_body_limit(tmp_path: Path) -> None:
    view = make_view(tmp_path, "server: {maxRequestBytes: 1024}\n")
    app = app_of(view)

    @app.post("/v1/echo")
    async def echo() -> str:
        from quart import request

        return str(len(await request.get_data()))

    client = app.test_client()
    assert (await client.post("/v1/echo", data=b"x" * 100)).status_code == 200
    resp = await client.post("/v1/echo", data=b"x" * 4096)
    assert resp.status_code == 413
    assert resp.headers["Content-Type"] == "application/json"


async def test_api_token_file_is_reread_on_change_and_fails_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    token = tmp_path / "token"
    token.write_text("first-token-aaaa\n")
    view = make_view(tmp_path, f"server: {{apiTokenFile: {token}}}\n")
    client = app_of(view).test_client()

    async def status(value: str) -> int:
        return (await client.get("/v1/state", headers={"Authorization": f"Bearer {value}"})).status_code

    assert await status("first-token-aaaa") == 200
    # Rewritten in place, same length (so size and maybe mtime look unchanged): the new token works, the old no more.
    with token.open("r+") as f:
        f.write("other-token-bbbb\n")
    assert await status("other-token-bbbb") == 200
    assert await status("first-token-aaaa") == 401
    # Replaced the way a Kubernetes secret volume does it: a new file renamed over the old one.
    fresh = tmp_path / "token.new"
    fresh.write_text("third-token\n")
    fresh.replace(token)
    assert await status("third-token") == 200
    assert await status("other-token-bbbb") == 401
    # Missing, then empty: every guarded request is refused, logged once; the open paths stay open.
    with caplog.at_level(logging.ERROR, logger="nvdaemon.server.token"):
        token.unlink()
        for _ in range(3):
            assert await status("third-token") == 401
        token.write_text("  \n")
        assert await status("third-token") == 401
        assert (await client.get("/healthz")).status_code != 401
    refusals = [r for r in caplog.records if "api token file" in r.getMessage()]
    assert len(refusals) == 1 and "third-token" not in caplog.text
    token.write_text("fourth-token\n")
    assert await status("fourth-token") == 200


async def test_missing_token_file_at_start_fails_closed(tmp_path: Path) -> None:
    view = make_view(tmp_path, f"server: {{apiTokenFile: {tmp_path / 'absent'}}}\n")
    client = app_of(view).test_client()  # building the app no longer fails: the server keeps its probes
    assert (await client.get("/v1/state", headers={"Authorization": "Bearer x"})).status_code == 401
    assert (await client.get("/readyz")).status_code == 503


async def test_shutdown_does_not_wait_for_a_server_in_backoff(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The HTTP task failing (its port taken) sleeps in the supervisor's backoff, up to 60 s; a shutdown cancels it
    rather than waiting for its next attempt, which only the end of shutdownGraceSeconds would otherwise cut."""
    squatter = trio.socket.socket()
    await squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    port = squatter.getsockname()[1]
    host = tmp_path / "host"
    host.mkdir()
    extra = f"tiers: []\nsinks: {{metrics: {{listenAddr: '127.0.0.1:{port}'}}}}\nshutdownGraceSeconds: 30\n"
    agent = Agent(parse_config(make_config_text(tmp_path, extra), "test.yaml", env={}), host_root=host)
    with squatter:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run)
            await trio.sleep(600)  # many failed attempts: the backoff is at its longest (30-60 s)
            assert agent.supervisor is not None
            http = agent.supervisor.tasks["http"]
            failures = http.consecutive_failures
            assert failures >= 8
            while http.consecutive_failures == failures:  # stop just after a failure: its whole backoff is ahead
                await trio.sleep(1)
            assert http.state == "backoff"
            began = trio.current_time()
            agent.stopping.set()
        took = trio.current_time() - began
    assert took < 5  # not the rest of the backoff (at least 29 s), nor the 30 s grace
