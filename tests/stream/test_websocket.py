"""/v1/events against a real server in process, with real trio-websocket clients: replay (since, replay, unknown
cursor), every filter, backpressure (1013 for a client that does not read, nothing lost for one that does), 100
concurrent clients, maxClients, the token guard, pings, idle clients, and 1001 on shutdown."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import msgspec
import pytest
import trio
import trio_websocket

from nvdaemon.model import Phase
from tests.polling import until
from tests.stream.harness import Server, make_event, metric_value, nothing_more, receive, running


def ids(docs: list[dict[str, object]]) -> list[object]:
    return [d["id"] for d in docs]


async def test_replay_since_and_last_n_then_live_without_gap_or_repeat(tmp_path: Path) -> None:
    async with running(tmp_path) as srv:
        events = [make_event(i) for i in range(10)]
        await srv.publish(events)
        async with srv.connect(replay=3) as last3, srv.connect(since=events[4].id) as after4, srv.connect() as live:
            assert ids(await receive(last3, 3)) == [e.id for e in events[7:]]
            assert ids(await receive(after4, 5)) == [e.id for e in events[5:]]
            more = [make_event(i) for i in range(10, 13)]
            await srv.publish(more)
            for ws in (last3, after4, live):
                got = await receive(ws, 3)
                assert ids(got) == [e.id for e in more]
                assert await nothing_more(ws)
            # The message is the webhook's CloudEvent, unchanged.
            assert got[0]["type"] == "com.nodevitals.hw.event.v1" and got[0]["source"] == "nodevitals/n1"
            assert "subject" not in got[0] and got[0]["data"]["seq"] == 10
        # since = the newest id: nothing to replay, only what comes next.
        async with srv.connect(since=more[-1].id) as ws:
            assert await nothing_more(ws)
            await srv.publish([make_event(13)])
            assert (await receive(ws, 1))[0]["data"]["seq"] == 13


async def test_websocket_and_json_carry_the_go_data_shape(tmp_path: Path) -> None:
    """The same ``data`` as the webhook's: RFC 3339 times, ``ended_at`` only on the EXIT (contract §3)."""
    enter = make_event(7, severity="critical")
    exit_ = msgspec.structs.replace(make_event(8, severity="critical", phase=Phase.EXIT), started_at=enter.started_at)
    detail = {"value": 7.0, "threshold": 0.5, "metric": "load1", "labels": {}}
    common = {"node": "n1", "tier": "core", "device": "cpu", "condition": "load_high", "severity": "critical"}
    want = [
        {"id": enter.id, **common, "phase": "ENTER", "seq": 7, "started_at": "2023-11-14T22:13:27Z"},
        {
            "id": exit_.id,
            **common,
            "phase": "EXIT",
            "seq": 8,
            "started_at": "2023-11-14T22:13:27Z",
            "ended_at": "2023-11-14T22:14:28Z",
        },
    ]
    want[0]["detail"], want[1]["detail"] = detail, {**detail, "value": 8.0}
    async with running(tmp_path) as srv:
        async with srv.connect() as ws:
            await srv.publish([enter, exit_])
            live = await receive(ws, 2)
        async with srv.connect(replay=2) as ws:
            replayed = await receive(ws, 2)
        async with httpx.AsyncClient(base_url=f"http://{srv.host}:{srv.port}") as http:
            stored = (await http.get("/v1/events")).json()["events"]
    for docs in (live, replayed, stored):
        assert [d["data"] for d in docs] == want
        order = ["id", "node", "tier", "device", "condition", "phase", "severity", "seq", "started_at"]
        # The Go field order; ended_at absent on the ENTER (not null).
        assert [list(d["data"]) for d in docs] == [[*order, "detail"], [*order, "ended_at", "detail"]]
        assert [d["time"] for d in docs] == ["2023-11-14T22:13:27Z", "2023-11-14T22:14:28Z"]
        assert all("subject" not in d for d in docs)


async def test_unknown_cursor_says_so_then_sends_the_whole_buffer(tmp_path: Path) -> None:
    async with running(tmp_path, stream="{bufferSize: 5}") as srv:
        events = [make_event(i) for i in range(8)]
        await srv.publish(events)
        for cursor in (events[1].id, "0190d9b8-0000-7000-8000-000000000000"):  # evicted; from before a restart
            async with srv.connect(since=cursor) as ws:
                control, *replayed = await receive(ws, 6)
                assert control["type"] == "control" and control["status"] == "unknown_cursor"
                assert control["since"] == cursor and control["oldest"] == events[3].id
                assert ids(replayed) == [e.id for e in events[3:]]
                assert await nothing_more(ws)
        # The unknown cursor and a filter together: the control message, then the matching part of the buffer.
        async with srv.connect(since=events[0].id, condition="nope") as ws:
            (control,) = await receive(ws, 1)
            assert control["replaying"] == 0
            assert await nothing_more(ws)


async def test_every_filter_on_replay_live_and_json(tmp_path: Path) -> None:
    mixed = [
        make_event(0, severity="info", condition="load_high", device="cpu", tier="core"),
        make_event(1, severity="warning", condition="temp_high", device="nvme0", tier="smart"),
        make_event(2, severity="critical", condition="xid", device="gpu0", tier="gpu"),
        make_event(3, severity="critical", condition="temp_high", device="gpu1", tier="gpu", phase=Phase.EXIT),
        make_event(4, severity="warning", condition="load_high", device="cpu", tier="core"),
    ]
    cases: list[tuple[dict[str, str], list[int]]] = [
        ({"severity": "warning"}, [1, 2, 3, 4]),
        ({"severity": "critical"}, [2, 3]),
        ({"condition": "temp_high"}, [1, 3]),
        ({"condition": "xid,load_high"}, [0, 2, 4]),
        ({"device": "gpu*"}, [2, 3]),
        ({"device": "nvme?"}, [1]),
        ({"tier": "gpu"}, [2, 3]),
        ({"tier": "core", "severity": "warning"}, [4]),
    ]
    async with running(tmp_path) as srv:
        first, second = mixed[:3], mixed[3:]
        await srv.publish(first)
        async with trio.open_nursery() as nursery:
            clients = [
                await trio_websocket.connect_websocket(
                    nursery, srv.host, srv.port, srv.resource(replay=100, **q), use_ssl=False
                )
                for q, _ in cases
            ]
            replayed = [
                [d["data"]["seq"] for d in await receive(ws, sum(1 for i in want if i < 3))]
                for ws, (_, want) in zip(clients, cases, strict=True)
            ]
            await srv.publish(second)
            for ws, (query, want), got in zip(clients, cases, replayed, strict=True):
                got += [d["data"]["seq"] for d in await receive(ws, sum(1 for i in want if i >= 3))]
                assert got == want, query
                assert await nothing_more(ws, 0.05), query
                await ws.aclose()
        async with httpx.AsyncClient(base_url=f"http://{srv.host}:{srv.port}") as http:
            for query, want in cases:
                resp = await http.get("/v1/events", params=query)
                assert resp.status_code == 200
                assert [e["data"]["seq"] for e in resp.json()["events"]] == want, query
            whole = (await http.get("/v1/events")).json()
            assert [e["id"] for e in whole["events"]] == [e.id for e in mixed] and whole["status"] == "ok"
            after = (await http.get("/v1/events", params={"since": mixed[1].id})).json()
            assert [e["data"]["seq"] for e in after["events"]] == [2, 3, 4]
            unknown = (await http.get("/v1/events", params={"since": "x"})).json()
            assert unknown["status"] == "unknown_cursor" and len(unknown["events"]) == 5
            for bad in ({"severity": "loud"}, {"replay": "-1"}, {"since": "x", "replay": "1"}):
                assert (await http.get("/v1/events", params=bad)).status_code == 400
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with srv.connect(severity="loud"):
                pass
        assert rejected.value.status_code == 400


async def _slow_client(srv: Server, nursery: trio.Nursery) -> trio_websocket.WebSocketConnection:
    """A websocket client that reads nothing until told to: a small receive buffer, so TCP stalls soon."""
    sock = trio.socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    await sock.connect((srv.host, srv.port))
    return await trio_websocket.wrap_client_stream(nursery, trio.SocketStream(sock), srv.host, srv.resource())


async def test_slow_client_is_closed_with_1013_while_a_reader_gets_everything_in_order(tmp_path: Path) -> None:
    async with running(tmp_path, stream="{clientQueue: 64}") as srv, trio.open_nursery() as nursery:
        slow = await _slow_client(srv, nursery)
        events = [make_event(i) for i in range(3000)]
        async with srv.connect() as fast:
            got: list[dict[str, object]] = []

            async def read_all() -> None:
                got.extend(await receive(fast, len(events), timeout=30))

            async with trio.open_nursery() as readers:
                readers.start_soon(read_all)
                await srv.publish(events, batch=20)
            assert ids(got) == [e.id for e in events]
            assert srv.hub.disconnects["slow"] == 1 and len(srv.hub.clients) == 1
        # The slow client now reads: an in-order prefix of the events, then close code 1013.
        prefix: list[object] = []
        with pytest.raises(trio_websocket.ConnectionClosed) as closed, trio.fail_after(10):
            while True:
                prefix.append(json.loads(await slow.get_message())["id"])
        assert closed.value.reason is not None and closed.value.reason.code == 1013
        assert 0 < len(prefix) < len(events) and prefix == [e.id for e in events[: len(prefix)]]
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://{srv.host}:{srv.port}/metrics")).text
        assert metric_value(text, 'nodevitals_stream_disconnects_total{reason="slow"}') == 1
        assert metric_value(text, "nodevitals_stream_messages_total") >= len(events)
        nursery.cancel_scope.cancel()


async def test_client_that_never_reads_is_aborted_by_the_kernel(tmp_path: Path) -> None:
    """Hypercorn writes with a shielded send_all: only the kernel (TCP_USER_TIMEOUT) can end a peer that keeps its
    window shut. headerTimeoutSeconds 1 sets it to 1 s."""
    extra = "server: {headerTimeoutSeconds: 1}\n"
    async with running(tmp_path, stream="{clientQueue: 64}", extra=extra) as srv:
        sock = trio.socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect((srv.host, srv.port))
        stream = trio.SocketStream(sock)
        key = b"dGhlIHNhbXBsZSBub25jZQ=="
        await stream.send_all(
            b"GET /v1/events HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        await until(lambda: srv.hub.clients, "the client in the hub", timeout=5, step=0.01)
        (client,) = srv.hub.clients
        await srv.publish([make_event(i) for i in range(3000)], batch=20)
        assert srv.hub.disconnects["slow"] == 1
        try:
            with trio.fail_after(8):
                await client.done.wait()  # the route finished: the kernel aborted its connection under it
            with pytest.raises(trio.BrokenResourceError):  # the client sees the abort as a reset
                for _ in range(10_000):
                    await stream.send_all(b"\x00" * 1024)
                    await trio.sleep(0)
        finally:
            await stream.aclose()  # if it was not aborted, this lets the server stop (the test has failed)


async def test_100_concurrent_clients_each_get_every_event_in_order(tmp_path: Path) -> None:
    async with running(tmp_path, stream="{maxClients: 128}") as srv, trio.open_nursery() as nursery:
        clients = [
            await trio_websocket.connect_websocket(nursery, srv.host, srv.port, srv.resource(), use_ssl=False)
            for _ in range(100)
        ]
        assert len(srv.hub.clients) == 100
        events = [make_event(i) for i in range(50)]
        results: dict[int, list[object]] = {}

        async def read(i: int, ws: trio_websocket.WebSocketConnection) -> None:
            results[i] = ids(await receive(ws, len(events), timeout=20))

        async with trio.open_nursery() as readers:
            for i, ws in enumerate(clients):
                readers.start_soon(read, i, ws)
            await srv.publish(events, batch=10)
        assert len(results) == 100
        assert all(got == [e.id for e in events] for got in results.values())
        assert srv.hub.disconnects["slow"] == 0
        nursery.cancel_scope.cancel()


async def test_the_65th_client_is_refused_with_503_before_the_upgrade(tmp_path: Path) -> None:
    async with running(tmp_path) as srv, trio.open_nursery() as nursery:
        clients = [
            await trio_websocket.connect_websocket(nursery, srv.host, srv.port, srv.resource(), use_ssl=False)
            for _ in range(64)
        ]
        with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
            async with srv.connect():
                pass
        assert rejected.value.status_code == 503
        assert srv.hub.disconnects["full"] == 1 and len(srv.hub.clients) == 64
        # One leaves: a newcomer gets in.
        await clients[0].aclose()
        await until(lambda: len(srv.hub.clients) <= 63, "the closed client gone from the hub", timeout=5, step=0.01)
        async with srv.connect(replay=1):
            assert len(srv.hub.clients) == 64
        nursery.cancel_scope.cancel()


async def test_token_required_over_websocket_and_http(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    async with running(tmp_path, extra=f"server: {{apiTokenFile: {token}}}\n") as srv:
        await srv.publish([make_event(0)])
        for headers in (None, [(b"authorization", b"Bearer wrong")], [(b"authorization", b"s3cret-token")]):
            with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                async with srv.connect(headers=headers, replay=1):
                    pass
            assert rejected.value.status_code == 401
            assert b"s3cret" not in (rejected.value.body or b"")
        assert srv.hub.clients == set()
        async with srv.connect(headers=[(b"authorization", b"Bearer s3cret-token")], replay=1) as ws:
            assert (await receive(ws, 1))[0]["data"]["seq"] == 0
        async with httpx.AsyncClient(base_url=f"http://{srv.host}:{srv.port}") as http:
            assert (await http.get("/v1/events")).status_code == 401
            ok = await http.get("/v1/events", headers={"Authorization": "Bearer s3cret-token"})
            assert ok.status_code == 200 and len(ok.json()["events"]) == 1
            assert (await http.get("/metrics")).status_code == 200


async def test_idle_client_outlives_the_header_timeout_and_is_pinged(tmp_path: Path) -> None:
    """hypercorn's read_timeout would cut a websocket client that has nothing to say; it must be off."""
    extra = "server: {headerTimeoutSeconds: 1}\n"
    async with running(tmp_path, stream="{pingSeconds: 0.5}", extra=extra) as srv, srv.connect() as ws:
        with trio.fail_after(5):
            pings = [json.loads(await ws.get_message()) for _ in range(4)]  # ~2 s, silent client
        assert pings == [{"type": "ping"}] * 4
        await srv.publish([make_event(7)])
        with trio.fail_after(5):
            while (doc := json.loads(await ws.get_message()))["type"] == "ping":
                pass
        assert doc["data"]["seq"] == 7


async def test_clients_are_closed_with_1001_on_shutdown_after_pending_events(tmp_path: Path) -> None:
    closed: list[trio_websocket.CloseReason | None] = []
    got: list[object] = []
    events = [make_event(i) for i in range(5)]

    async def read(ws: trio_websocket.WebSocketConnection) -> None:
        try:
            while True:
                got.append(json.loads(await ws.get_message())["id"])
        except trio_websocket.ConnectionClosed as exc:
            closed.append(exc.reason)

    async with trio.open_nursery() as outer:
        async with running(tmp_path) as srv:
            ws = await trio_websocket.connect_websocket(outer, srv.host, srv.port, srv.resource(), use_ssl=False)
            outer.start_soon(read, ws)
            for ev in events:
                srv.agent.bus.publish(ev)  # still in the hub's bus channel when the shutdown starts
        # Leaving `running` stopped the hub, then hypercorn, as Agent.run does.
        await until(lambda: closed, "the close frame", timeout=5, step=0.01)
    assert got == [e.id for e in events]
    assert closed[0] is not None and closed[0].code == 1001
