"""The server reads sinks and history only through ``nvdaemon.view``: no module under ``nvdaemon/server`` imports
``nvdaemon.sinks`` or ``nvdaemon.history`` (checked on the source, so an import under ``TYPE_CHECKING`` or inside a
function counts; ``make lint`` checks the same with import-linter's ``server-view-only`` contract), and the view's
helpers give the routes what they read of them before: each webhook endpoint's URL, history's answers and refusals,
and the websocket hub's replay and clients."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import trio

from nvdaemon import view as view_module
from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.server.self_metrics import delivery_dropped
from nvdaemon.sinks import build_sinks
from tests.server.fakeview import FakeView, make_view
from tests.server.test_layering import PACKAGE, module_imports
from tests.sinks.helpers import event

FORBIDDEN = ("nvdaemon.sinks", "nvdaemon.history")


def test_nothing_under_server_imports_a_sink_or_history() -> None:
    files = sorted((PACKAGE / "server").rglob("*.py"))
    assert len(files) > 10
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(
            m for m in module_imports(path) if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
        )
        for path in files
    }
    assert {path: mods for path, mods in offenders.items() if mods} == {}


def test_the_import_contract_forbids_them_without_exceptions() -> None:
    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c.get("id") == "server-view-only"]
    assert contract["type"] == "forbidden"
    assert contract["source_modules"] == ["nvdaemon.server"]
    assert sorted(contract["forbidden_modules"]) == sorted(FORBIDDEN)
    assert "ignore_imports" not in contract


def agent_with_sinks(tmp_path: Path, sinks: str) -> Agent:
    text = f"node: n1\nstateDir: {tmp_path / 'state'}\nsinks:\n{sinks}"
    agent = Agent(parse_config(text, "test.yaml", env={}))
    agent.sinks.update({s.name: s for s in build_sinks(agent.sink_context())})
    return agent


def test_webhook_targets_give_each_endpoint_its_url_and_the_go_label_follows(tmp_path: Path) -> None:
    agent = agent_with_sinks(
        tmp_path,
        "  webhook:\n"
        '    - {url: "https://user:secret@hooks.example:8443/a?x=1"}\n'
        '    - {url: "http://127.0.0.1:9/b"}\n'
        "  stream: {enabled: true}\n",
    )
    targets = view_module.webhook_targets(agent)
    assert set(targets) == {n for n in agent.sinks if n.startswith("webhook:")} and len(targets) == 2
    assert sorted(targets.values()) == ["http://127.0.0.1:9/b", "https://user:secret@hooks.example:8443/a?x=1"]
    # /metrics names each endpoint as the Go agent did: scheme and host, no userinfo or path
    labels = [s.labels["sink"] for s in delivery_dropped(agent).samples]
    assert labels == sorted(["stream", "webhook:http://127.0.0.1:9", "webhook:https://hooks.example:8443"])


def test_webhook_targets_are_empty_without_an_endpoint(tmp_path: Path) -> None:
    agent = agent_with_sinks(tmp_path, "  stream: {enabled: true}\n")
    assert view_module.webhook_targets(agent) == {}


def view_with(tmp_path: Path, extra: str) -> tuple[FakeView, dict[str, Any]]:
    """A fake view whose sinks are built from ``extra`` as the agent builds them (not started)."""
    fake = make_view(tmp_path, extra)
    sinks = {s.name: s for s in build_sinks(Agent(fake.loaded).sink_context())}
    fake.update(sinks=sinks, history=sinks.get("history"), stream=sinks.get("stream"))
    return fake, sinks


async def test_query_history_refuses_in_plain_values(tmp_path: Path) -> None:
    off = make_view(tmp_path)
    assert await view_module.query_history(off, "gpu_power_watts", {}, now=1e9) is None
    fake, _ = view_with(tmp_path, "history: {enabled: true}\n")
    bad = await view_module.query_history(fake, "gpu_power_watts", {"range": ["soon"]}, now=1e9)
    assert isinstance(bad, view_module.HistoryRefusal)
    assert (bad.reason, bad.param) == ("parameter", "range") and bad.detail.startswith("range: ")
    unknown = await view_module.query_history(fake, "gpu_power_watts", {"colour": ["red"]}, now=1e9)
    assert isinstance(unknown, view_module.HistoryRefusal) and unknown.param == "colour"
    # the sink's task has not opened its store
    closed = await view_module.query_history(fake, "gpu_power_watts", {}, now=1e9)
    assert closed == view_module.HistoryRefusal("unavailable")
    assert [view_module.history_tier(m) for m in ("gpu_power_watts", "smart_temp", "load1")] == [
        "gpu",
        "smart",
        "core",
    ]


async def test_event_stream_replays_parses_and_refuses_as_the_hub_does(tmp_path: Path) -> None:
    from nvdaemon.sinks.stream.hub import CLOSE_GOING_AWAY, Frame

    assert view_module.STREAM_GOING_AWAY == CLOSE_GOING_AWAY
    assert view_module.stream_frame(b'{"type":"ping"}').wire == Frame.of(b'{"type":"ping"}').wire
    assert view_module.event_stream(make_view(tmp_path / "off")) is None

    fake, sinks = view_with(tmp_path, "sinks: {stream: {enabled: true, bufferSize: 3, maxClients: 1}}\n")
    hub = sinks["stream"]
    assert view_module.event_stream(fake) is None  # built, not running yet
    async with trio.open_nursery() as nursery:
        hub.attach(fake.bus)
        await nursery.start(hub.serve)
        stream = view_module.event_stream(fake)
        assert stream is not None and stream.buffer_size == 3
        for i in range(4):
            hub.publish(event(i))
        ids = [f'"id":"{event(i).id}"' for i in range(4)]

        def shown(replay: view_module.StreamReplay) -> list[str]:
            return [next(i for i in ids if i in f.text) for f in replay.messages]

        everything = stream.request({})
        assert not isinstance(everything, str)
        assert shown(stream.recent(*everything)) == ids[1:]  # neither since nor replay: the whole buffer
        last = stream.request({"replay": ["1"]})
        assert not isinstance(last, str) and shown(stream.recent(*last)) == ids[3:]
        assert stream.request({"severity": ["loud"]}) == "severity: expected info, warning or critical"
        assert stream.request({"since": ["x"], "replay": ["2"]}) == "since and replay exclude each other"

        first = stream.connect(*everything)
        assert first is not None and shown(first[1]) == []  # a websocket without since or replay: live only
        assert stream.connect(*last) is None  # maxClients reached
        stream.disconnect(first[0])
        again = stream.connect(*last)
        assert again is not None and shown(again[1]) == ids[3:]
        hub.publish(event(4))
        assert f'"id":"{event(4).id}"' in again[0].receive.receive_nowait().text  # live, after the replay
        stream.disconnect(again[0])
        nursery.cancel_scope.cancel()
