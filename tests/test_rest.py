"""The REST answers of a running agent (``nvdaemon run`` as a subprocess on a copy of the faulty fixture host), read
by a client written for the Go agent's shapes (nodevitals-contract.md section 4): ``/v1/state`` and
``/v1/history/{metric}`` decode into the Go agent's own types, ``range`` takes Go durations, our status document is at
``/v1/status`` for ``nvdaemon state``, and all three stay behind the API token.

The Go client's types below are the Go agent's ``model.Sample`` and ``history.SeriesHistory``/``history.Point``
written as msgspec structs: a field of the wrong JSON type, a missing required field or an object where Go expects
an array fails the decode as it fails ``encoding/json``; a timestamp must be what Go's ``time.Time`` unmarshals
(RFC 3339, one to nine fraction digits). Keys Go does not know (our ``min`` and ``max``) are ignored, as Go does.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from nvdaemon import cli
from nvdaemon.history.core import Acc
from nvdaemon.history.store import HistoryStore
from tests.test_e2e import ROOT, Agent, free_port, wait_for

pytestmark = pytest.mark.e2e

TOKEN = "rest-token-5b1e"
CONFIG = """
node: rest-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
server: {{apiTokenFile: {token}}}
rules:
  - {{metric: load1, device: cpu, condition: load_high, threshold: 16}}
history: {{enabled: true, intervalMinutes: 5, metrics: [gpu_temperature_celsius, load1]}}
"""


# ---- the Go agent's types, as a Go client declares them ---------------------------------------------------------
class GoSample(msgspec.Struct):  # model.Sample
    node: str
    tier: str
    device: str
    metric: str
    value: float
    timestamp: str
    kind: str = ""  # `json:"kind,omitempty"`
    labels: dict[str, str] = {}  # `json:"labels,omitempty"`


class GoPoint(msgspec.Struct):  # history.Point
    timestamp: str
    value: float


class GoSeries(msgspec.Struct):  # history.SeriesHistory
    metric: str
    node: str
    tier: str
    device: str
    points: list[GoPoint]
    labels: dict[str, str] = {}  # `json:"labels,omitempty"`


GO_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)")


def go_time(text: str) -> dt.datetime:
    """What Go's ``time.Time.UnmarshalJSON`` accepts, as an aware datetime."""
    assert GO_RFC3339.fullmatch(text), text
    return dt.datetime.fromisoformat(text)  # Python 3.11 reads "Z" and any count of fraction digits


# ---- the running agent ------------------------------------------------------------------------------------------
SEEDED: list[tuple[int, float]] = []  # (window end, average) of gpu0's temperature, oldest first


def seed_history(state: Path) -> None:
    """Three hours of one GPU's temperature, in 5-minute windows up to the last one ended, in the agent's history
    file before it starts."""
    newest = (int(time.time()) // 300) * 300
    SEEDED[:] = [(newest - i * 300, 60.0 + i) for i in reversed(range(36))]
    store = HistoryStore(state / "history.db")
    key = ("gpu_temperature_celsius", "gpu0", (("gpu_uuid", "GPU-0a1b"),))
    store.write([((key, end), Acc(2, 2 * v, v - 1, v + 1)) for end, v in SEEDED])
    store.close()


def in_range(span: float, before: float, after: float) -> list[list[tuple[int, float]]]:
    """The seeded points a range of ``span`` seconds may answer, asked between ``before`` and ``after``: the agent
    keeps points stamped at or after the second holding now - range, as the Go agent does."""
    return [[(t, v) for t, v in SEEDED if t >= math.floor(now - span)] for now in (before, after)]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One agent for the module: every test only reads from it."""
    tmp_path = tmp_path_factory.mktemp("rest")
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    seed_history(tmp_path / "state")
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", port=free_port(), token=token))
    a = Agent(tmp_path, host, config)
    a.start()
    yield a
    a.kill()


def get(agent: Agent, path: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    req = urllib.request.Request(agent.base + path)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def history(agent: Agent, metric: str, **params: str) -> tuple[int, bytes]:
    return get(agent, f"/v1/history/{metric}?{urllib.parse.urlencode(params)}")


# ---- the tests --------------------------------------------------------------------------------------------------
def test_state_is_read_by_a_go_client(agent: Agent) -> None:
    started = dt.datetime.now(dt.UTC)
    status, body = get(agent, "/v1/state")
    assert status == 200
    samples = msgspec.json.decode(body, type=list[GoSample])
    raw = json.loads(body)
    assert len(samples) == len(raw) > 20
    for s, r in zip(samples, raw, strict=True):
        assert (s.node, s.tier) == ("rest-node", "core")
        # Go's omitempty: kind only on counters, labels only when there are some; nothing else beside them.
        assert set(r) == {"node", "tier", "device", "metric", "value", "timestamp"} | {
            k for k in ("kind", "labels") if k in r
        }
        assert r.get("kind", "counter") == "counter" and r.get("labels", {"x": ""}) != {}
        assert started - dt.timedelta(minutes=1) < go_time(s.timestamp) <= dt.datetime.now(dt.UTC)
    by_key = {(s.metric, s.device): s for s in samples if not s.labels}
    assert by_key[("load1", "cpu")].value == 24.51
    assert by_key[("net_rx_bytes_total", "eth0")].kind == "counter"
    assert any(s.labels for s in samples)


def test_history_is_read_by_a_go_client(agent: Agent) -> None:
    before = time.time()
    status, body = history(agent, "gpu_temperature_celsius", range="1h30m")
    after = time.time()
    assert status == 200, body
    (series,) = msgspec.json.decode(body, type=list[GoSeries])
    assert (series.metric, series.node, series.tier, series.device) == (
        "gpu_temperature_celsius",
        "rest-node",
        "gpu",
        "gpu0",
    )
    assert series.labels == {"gpu_uuid": "GPU-0a1b"}
    got = [(int(go_time(p.timestamp).timestamp()), p.value) for p in series.points]
    assert got in in_range(5400, before, after) and len(got) >= 18  # oldest first
    # Beside Go's value, the window's minimum and maximum.
    assert [(p["min"], p["max"]) for p in json.loads(body)[0]["points"]] == [(v - 1, v + 1) for _, v in got]


@pytest.mark.parametrize(
    ("range_", "span"),
    [("90m", 5400), ("2h45m30s", 9930), ("1.5h", 5400), ("7d", 7 * 86400), ("", 10**10), ("300ms", 0.3)],
)
def test_history_range_takes_go_durations(agent: Agent, range_: str, span: float) -> None:
    before = time.time()
    status, body = history(agent, "gpu_temperature_celsius", range=range_)
    after = time.time()
    assert status == 200, body
    answer = msgspec.json.decode(body, type=list[GoSeries])
    got = [(int(go_time(p.timestamp).timestamp()), p.value) for s in answer for p in s.points]
    assert got in in_range(span, before, after)


@pytest.mark.parametrize("range_", ["soon", "-1h", "0s", "1h30", "36501d", "2w"])
def test_history_bad_range_is_400(agent: Agent, range_: str) -> None:
    status, body = history(agent, "gpu_temperature_celsius", range=range_)
    assert status == 400
    assert json.loads(body)["parameter"] == "range"


def test_history_filters_and_unknown_metric(agent: Agent) -> None:
    for params in ({"node": "another-node"}, {"device": "gpu7"}):
        status, body = history(agent, "gpu_temperature_celsius", **params)
        assert (status, msgspec.json.decode(body, type=list[GoSeries])) == (200, [])
    status, body = history(agent, "gpu_temperature_celsius", node="rest-node", device="gpu0")
    assert len(msgspec.json.decode(body, type=list[GoSeries])) == 1
    assert history(agent, "no_such_metric") == (200, b"[]")


def test_status_document_for_nvdaemon_state_behind_the_token(agent: Agent) -> None:
    for path in ("/v1/state", "/v1/status", "/v1/history/gpu_temperature_celsius"):
        assert get(agent, path, token=None)[0] == 401
        assert get(agent, path, token="wrong")[0] == 401
    wait_for(lambda: json.loads(get(agent, "/v1/status")[1])["conditions"], "load_high ENTER")
    token_file = str(agent.config.parent / "token")
    cmd = [sys.executable, "-m", "nvdaemon", "state", agent.base, "--json", "--token-file", token_file]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["node"] == "rest-node"
    assert [(c["condition"], c["device"]) for c in doc["conditions"]] == [("load_high", "cpu")]
    assert doc["sinks"]["history"]["open"] is True
    assert TOKEN not in done.stdout
    refused = subprocess.run(cmd[:-2], capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    assert refused.returncode == 1 and "401" in refused.stderr


def test_nvdaemon_state_reports_a_bad_token_file_or_a_non_json_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 1 with one line on stderr, not a traceback: a token file that is missing or empty, an answer that is
    not JSON (something other than nvdaemon on that port)."""

    class NotJson(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"<html/>\r\n")

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotJson)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    try:
        for args in (["--token-file", str(tmp_path / "missing")], ["--token-file", str(empty)], []):
            assert cli.main(["state", url, *args]) == 1
            err = capsys.readouterr().err
            assert err.startswith("nvdaemon state: ") and err.count("\n") == 1, err
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
