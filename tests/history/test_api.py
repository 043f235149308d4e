"""``GET /v1/history/{metric}`` through the app (quart-trio test client): the Go agent's array of series, every
parameter (``range`` as days or Go durations), errors as JSON naming the parameter, 413 with a hint, 404 in Go's
words when disabled, the token guard, SQL-looking values as data, and hypothesis garbage for each parameter that never
gives a 500."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvdaemon.app import Agent
from nvdaemon.gotime import rfc3339
from nvdaemon.history.core import EPOCH, MAX_POINTS, Acc, quantum_for
from nvdaemon.history.service import HistorySink
from nvdaemon.history.store import _UPSERT, HistoryStore, QueryResult, SeriesResult
from nvdaemon.model import Sample, TierSnapshot, make_labels
from nvdaemon.server.app import build_app
from nvdaemon.server.history_routes import CHUNK, GoPoint, GoSeries, series_json
from nvdaemon.sqlitetx import transaction
from nvdaemon.supervise import Supervisor
from tests.history.helpers import Wall, make_agent, snap

NOW = (int(time.time()) // 300) * 300  # the newest window end; points are laid out back from it
EVIL_METRIC = "x'; DROP TABLE points; --"
EVIL_DEVICE = "gpu0' OR '1'='1"


def fill(sink: HistorySink) -> None:
    """Two days of 5-minute windows: two GPUs' temperature, one GPU's power; one SQL-looking series."""
    for i in range(576):
        end = NOW - i * 300
        rows = [("gpu_temperature_celsius", f"gpu{g}", 40.0 + g + (i % 12), end - 10) for g in (0, 1)]
        rows += [("gpu_power_watts", "gpu0", 300.0, end - 10)]
        sink.ingest(snap(*rows))
    sink.ingest(snap((EVIL_METRIC, EVIL_DEVICE, 7.0, NOW - 10)))


async def get(agent: Agent, path: str, **params: str) -> tuple[int, Any]:
    client = build_app(agent, agent.loaded.config.server).test_client()
    resp = await client.get(path, query_string=params or None)
    body = await resp.get_data()
    assert resp.headers["Content-Type"] == "application/json"
    return resp.status_code, json.loads(body)


def unix(stamp: str) -> int:
    """A point's RFC 3339 timestamp back to unix seconds (window ends are whole seconds, written without a fraction)."""
    assert stamp.endswith("Z") and "." not in stamp, stamp
    return int(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())


def rows(series: dict[str, Any]) -> list[tuple[int, float, float, float]]:
    return [(unix(p["timestamp"]), p["value"], p["min"], p["max"]) for p in series["points"]]


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    agent = make_agent(
        tmp_path, f"{{enabled: true, metrics: [gpu_temperature_celsius, gpu_power_watts, {json.dumps(EVIL_METRIC)}]}}"
    )
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        sink = agent.sinks["history"]
        assert isinstance(sink, HistorySink)
        sink.wall = Wall(NOW + 1)
        fill(sink)
        assert await sink.flush() == 2 * 576 + 576 + 1
        yield agent
        nursery.cancel_scope.cancel()


async def test_go_array_of_series_points_oldest_first(agent: Agent) -> None:
    status, doc = await get(agent, "/v1/history/gpu_temperature_celsius")
    assert status == 200
    assert isinstance(doc, list)
    # Go's SeriesHistory: metric, node, tier, device, labels (left out when empty), points.
    assert [list(s) for s in doc] == [["metric", "node", "tier", "device", "points"]] * 2
    assert [(s["metric"], s["node"], s["tier"], s["device"], len(s["points"])) for s in doc] == [
        ("gpu_temperature_celsius", "n1", "gpu", "gpu0", 576),
        ("gpu_temperature_celsius", "n1", "gpu", "gpu1", 576),
    ]
    assert list(doc[1]["points"][-1]) == ["timestamp", "value", "min", "max"]
    pts = rows(doc[1])
    assert pts[-1] == (NOW, 41.0, 41.0, 41.0) and pts[0][0] == NOW - 575 * 300
    assert [p[0] for p in pts] == sorted(p[0] for p in pts)


async def test_labels_are_there_when_the_series_has_them(agent: Agent) -> None:
    sink = agent.sinks["history"]
    assert isinstance(sink, HistorySink)
    labelled = Sample("gpu_power_watts", "gpu1", 250.0, labels=make_labels({"gpu_uuid": "GPU-1"}), timestamp=NOW - 10)
    sink.ingest(TierSnapshot("gpu", [labelled], {}, collected_at=NOW - 10, duration=0.0))
    await sink.flush()
    _, doc = await get(agent, "/v1/history/gpu_power_watts", device="gpu1")
    assert doc == [
        {
            "metric": "gpu_power_watts",
            "node": "n1",
            "tier": "gpu",
            "device": "gpu1",
            "labels": {"gpu_uuid": "GPU-1"},
            "points": [{"timestamp": rfc3339(NOW), "value": 250.0, "min": 250.0, "max": 250.0}],
        }
    ]


async def test_unknown_metric_is_an_empty_array(agent: Agent) -> None:
    assert await get(agent, "/v1/history/no_such_metric") == (200, [])


async def test_range_takes_days_and_go_durations(agent: Agent) -> None:
    now = time.time()

    async def times(range_: str) -> list[int]:
        status, doc = await get(agent, "/v1/history/gpu_power_watts", range=range_)
        assert status == 200, doc
        return [p[0] for p in rows(doc[0])]

    hour = await times("1h")
    assert all(t >= now - 3600 - 1 for t in hour) and 11 <= len(hour) <= 13 and hour[-1] == NOW
    assert 5 <= len(await times("30m")) <= 7
    for go_duration in ("90m", "1h30m", "1.5h", "5400s", "5400000ms"):
        assert 17 <= len(await times(go_duration)) <= 19, go_duration
    assert 32 <= len(await times("2h45m30s")) <= 34
    assert 287 <= len(await times("1d")) <= 289  # one 5-min point either side: the clock moves between requests
    assert len(await times("")) == 576


async def test_step(agent: Agent) -> None:
    _, doc = await get(agent, "/v1/history/gpu_temperature_celsius", device="gpu0", step="1h")
    pts = rows(doc[0])
    assert all(p[0] % 3600 == 0 for p in pts)
    assert 48 <= len(pts) <= 49
    whole_hours = pts[1:-1]  # full buckets: the 12 distinct values 40..51 of gpu0
    assert whole_hours and all(p[2] == 40.0 and p[3] == 51.0 and p[1] == 45.5 for p in whole_hours)
    _, again = await get(agent, "/v1/history/gpu_temperature_celsius", device="gpu0", step="60m")
    assert again == doc


async def test_device_and_node(agent: Agent) -> None:
    _, doc = await get(agent, "/v1/history/gpu_temperature_celsius", device="gpu1")
    assert [s["device"] for s in doc] == ["gpu1"]
    _, doc = await get(agent, "/v1/history/gpu_temperature_celsius", device="gpu9")
    assert doc == []
    _, doc = await get(agent, "/v1/history/gpu_temperature_celsius", node="n1")
    assert len(doc) == 2
    _, doc = await get(agent, "/v1/history/gpu_temperature_celsius", node="other-node")
    assert doc == []


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"range": "ninety days"}, "range"),
        ({"range": "-1d"}, "range"),
        ({"range": "-1h"}, "range"),
        ({"range": "0s"}, "range"),
        ({"range": "9223372036854775808ns"}, "range"),
        ({"range": "36501d"}, "range"),
        ({"range": "1h30"}, "range"),
        ({"step": "10s"}, "step"),
        ({"step": "1y"}, "step"),
        ({"limit": "5"}, "limit"),
    ],
)
async def test_bad_parameters_are_400_naming_which(agent: Agent, params: dict[str, str], param: str) -> None:
    status, doc = await get(agent, "/v1/history/gpu_power_watts", **params)
    assert status == 400
    assert doc["error"] == "bad request" and doc["parameter"] == param and param in doc["detail"]


async def test_repeated_parameter_is_400(agent: Agent) -> None:
    client = build_app(agent, agent.loaded.config.server).test_client()
    resp = await client.get("/v1/history/gpu_power_watts?range=1d&range=2d")
    assert resp.status_code == 400 and json.loads(await resp.get_data())["parameter"] == "range"


async def test_sql_looking_values_stay_data(agent: Agent) -> None:
    status, doc = await get(agent, "/v1/history/" + quote(EVIL_METRIC, safe=""), device=EVIL_DEVICE)
    assert status == 200
    assert [(s["metric"], s["device"], rows(s)) for s in doc] == [(EVIL_METRIC, EVIL_DEVICE, [(NOW, 7.0, 7.0, 7.0)])]
    _, doc = await get(agent, "/v1/history/gpu_power_watts", device="' OR 1=1 --")
    assert doc == []
    _, doc = await get(agent, "/v1/history/gpu_power_watts")
    assert len(doc[0]["points"]) == 576  # nothing was dropped


async def test_more_than_the_limit_is_413_with_a_hint(agent: Agent) -> None:
    sink = agent.sinks["history"]
    assert isinstance(sink, HistorySink) and sink.store is not None
    store = sink.store

    def bulk() -> None:  # 200,001 minutes of one series, straight into the file
        sid, _ = store._series(("gpu_utilization_pct", "gpu0", ()))
        start = (NOW - EPOCH) // 60 - MAX_POINTS
        a = round(50 * -quantum_for("gpu_utilization_pct"))
        transaction(
            store.db, lambda: store.db.executemany(_UPSERT, ((sid, start + m, a, 0, 0) for m in range(MAX_POINTS + 1)))
        )

    await trio.to_thread.run_sync(bulk, limiter=sink.limiter)
    status, doc = await get(agent, "/v1/history/gpu_utilization_pct")
    assert status == 413
    assert doc["points"] == MAX_POINTS + 1 and doc["limit"] == MAX_POINTS and "step=" in doc["hint"]
    status, doc = await get(agent, "/v1/history/gpu_utilization_pct", step="1d")
    assert status == 200 and 139 <= len(doc[0]["points"]) <= 141
    assert rows(doc[0])[0][1:] == (50.0, 50.0, 50.0)
    status, doc = await get(agent, "/v1/history/gpu_utilization_pct", range="2400h")  # 144,000 points: under
    assert status == 200 and 143_990 <= len(doc[0]["points"]) <= 144_001


@pytest.mark.parametrize("sizes", [[], [0], [1], [CHUNK], [CHUNK + 1, 3], [2 * CHUNK + 5, 0, CHUNK - 1]])
def test_pieces_make_the_document_encoded_whole(sizes: list[int]) -> None:
    result = QueryResult(
        [
            SeriesResult(
                f"gpu{i}", {"gpu_uuid": f"GPU-{i}"} if i % 2 else {}, [(60 * k, k / 3, -k, 1e21) for k in range(n)]
            )
            for i, n in enumerate(sizes)
        ]
    )
    whole = [
        GoSeries(
            metric="m",
            node="n1",
            tier="core",
            device=s.device,
            labels=s.labels,
            points=[GoPoint(rfc3339(t), a, lo, hi) for t, a, lo, hi in s.points],
        )
        for s in result.series
    ]
    assert b"".join(series_json("m", "n1", result)) == msgspec.json.encode(whole)


async def test_token_guard_applies(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("history-token\n")
    agent = make_agent(tmp_path, extra=f"server: {{apiTokenFile: {token}}}\n")
    agent.sinks["history"] = agent.history = HistorySink(agent.sink_context())  # built, its task not started
    client = build_app(agent, agent.loaded.config.server).test_client()
    assert (await client.get("/v1/history/gpu_power_watts")).status_code == 401
    resp = await client.get("/v1/history/gpu_power_watts", headers={"Authorization": "Bearer history-token"})
    assert resp.status_code == 503  # past the guard; the store is not open (no task running)
    assert json.loads(await resp.get_data())["error"] == "history store not open yet"


async def test_disabled_is_404_in_gos_words(tmp_path: Path) -> None:
    status, doc = await get(make_agent(tmp_path, "{enabled: false}"), "/v1/history/gpu_power_watts", range="1d")
    assert (status, doc) == (404, {"error": "history not enabled"})


# ---- hypothesis garbage: one shared store, one trio.run per example ------------------------------------------
@pytest.fixture(scope="module")
def garbage_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    agent = make_agent(tmp_path_factory.mktemp("garbage"))
    sink = agent.sinks["history"] = agent.history = HistorySink(agent.sink_context())
    sink.store = HistoryStore(sink.path)
    sink.store.write([((("gpu_power_watts", "gpu0", ()), NOW), Acc(1, 1.0, 1.0, 1.0))])
    yield agent
    sink.store.close()


def ask(agent: Agent, metric: str, params: dict[str, str] | list[tuple[str, str]]) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        resp = (
            await build_app(agent, agent.loaded.config.server)
            .test_client()
            .get("/v1/history/" + quote(metric, safe=""), query_string=params)
        )
        if resp.status_code == 308:  # werkzeug merges the slashes of a metric that starts with "/": not an error
            return 308, None
        return resp.status_code, json.loads(await resp.get_data())

    return trio.run(go)


GARBAGE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
junk = st.text(max_size=40)


@GARBAGE
@given(param=st.sampled_from(["range", "step", "device", "node"]), value=junk)
def test_garbage_in_each_parameter_is_never_a_500(garbage_agent: Agent, param: str, value: str) -> None:
    status, doc = ask(garbage_agent, "gpu_power_watts", {param: value})
    assert status in (200, 400), (status, doc)
    if status == 400:
        assert doc["parameter"] == param
    else:
        assert isinstance(doc, list)


@GARBAGE
@given(metric=st.text(min_size=1, max_size=60))
def test_garbage_metric_is_never_a_500(garbage_agent: Agent, metric: str) -> None:
    status, doc = ask(garbage_agent, metric, {})
    assert status in (200, 400, 404, 308), (status, doc)  # 404 and 308: a metric with "/" is another path
    if status == 200:
        assert doc == [] or metric == "gpu_power_watts"


@GARBAGE
@given(pairs=st.lists(st.tuples(junk, junk), max_size=4))
def test_garbage_parameter_names_are_never_a_500(garbage_agent: Agent, pairs: list[tuple[str, str]]) -> None:
    status, doc = ask(garbage_agent, "gpu_power_watts", pairs)
    assert status in (200, 400), (status, doc)
