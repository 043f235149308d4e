"""The sink extension point: subscription outlives task restarts; reload keeps identical sinks, replaces changed
(fingerprints of what each sink was built from); the typed handles follow the sinks."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Hashable
from pathlib import Path

import pytest
import trio
import trio.testing

import nvdaemon.sinks
from nvdaemon import engine
from nvdaemon.app import Agent
from nvdaemon.bus import EventBus
from nvdaemon.config import LoadedConfig
from nvdaemon.configload import parse_config
from nvdaemon.history.service import HistorySink
from nvdaemon.model import Event, Phase
from nvdaemon.sinks import BusSubscriber, CommitTracker, ObservableDefaults, build_sinks
from nvdaemon.sinks.stream.hub import StreamHub
from nvdaemon.supervise import Supervisor


class Recorder(BusSubscriber, ObservableDefaults):
    def __init__(self, name: str, key: str, crash_first: int = 0) -> None:
        self.name = name
        self.key = key
        self.crash_first = crash_first
        self.received: list[str] = []

    def fingerprint(self) -> Hashable:
        return self.key

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async for event in self.events:
            if self.crash_first:
                self.crash_first -= 1
                self.received.append(f"crashed-on-{event.id}")
                raise RuntimeError("receiver bug")
            self.received.append(event.id)


def event(i: int) -> Event:
    return Event(str(i), "n", "core", "cpu", "load_high", Phase.ENTER, "warning", i, 0.0)


async def test_events_published_during_backoff_are_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    agent = Agent(parse_config(f"stateDir: {tmp_path}\n", "t.yaml", env={}))
    built = [Recorder("rec", "v1", crash_first=1)]
    monkeypatch.setattr(nvdaemon.sinks, "BUILDERS", (lambda _agent: built,))
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        sink = agent.sinks["rec"]
        assert isinstance(sink, Recorder)
        agent.bus.publish(event(1))  # crashes the sink
        await trio.sleep(0.01)
        assert agent.supervisor.tasks["rec"].state == "backoff"
        agent.bus.publish(event(2))  # published while the task is down
        await trio.sleep(120)
        assert sink.received == ["crashed-on-1", "2"]
        assert agent.supervisor.tasks["rec"].restarts == 1

        # Reload with an identical sink: the running object is kept (no restart).
        built[:] = [Recorder("rec", "v1")]
        await agent.sync_sinks()
        assert agent.sinks["rec"] is sink
        # A changed fingerprint replaces it; a removed one is stopped and unsubscribed.
        built[:] = [Recorder("rec", "v2")]
        await agent.sync_sinks()
        assert agent.sinks["rec"] is not sink
        agent.bus.publish(event(3))
        await trio.sleep(0.01)
        new = agent.sinks["rec"]
        assert isinstance(new, Recorder) and new.received == ["3"]
        built[:] = []
        await agent.sync_sinks()
        assert agent.sinks == {} and "rec" not in agent.bus.subscriptions
        nursery.cancel_scope.cancel()


class Durable(Recorder, CommitTracker):
    def attach(self, bus: EventBus) -> None:
        super().attach(bus)
        self.start_committed(bus.last_seq)


@contextlib.asynccontextmanager
async def agent_with_durable_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Agent, Durable, trio.Nursery]]:
    """An agent with one durable sink attached, after event 1 (seq 1) was emitted to it."""
    agent = Agent(parse_config(f"stateDir: {tmp_path}\n", "t.yaml", env={}))
    sink = Durable("spooler", "v1")
    monkeypatch.setattr(nvdaemon.sinks, "BUILDERS", (lambda _agent: [sink],))
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        agent.engine.seq = 1
        agent.emit([event(1)])
        yield agent, sink, nursery
        nursery.cancel_scope.cancel()


async def test_engine_state_is_saved_only_after_durable_sinks_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    async with agent_with_durable_sink(tmp_path, monkeypatch) as (agent, sink, _):
        await agent.persist_engine()  # the sink received event 1 but has not committed it
        assert not agent.engine_path.exists()
        sink.mark_committed(1)
        await agent.persist_engine()
        assert agent.engine_path.exists()
        # A sink attached later owes nothing for events published before it existed.
        late = Durable("late", "v1")
        late.attach(agent.bus)
        assert late.committed_seq == 1


async def test_events_emitted_while_waiting_for_the_spool_are_not_saved_ahead_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    async with agent_with_durable_sink(tmp_path, monkeypatch) as (agent, sink, nursery):

        async def another_tier_emits_then_spool_commits_only_1() -> None:
            await trio.sleep(0.1)
            agent.engine.seq = 2  # seq 2 is published while persist_engine waits for seq 1
            agent.emit([event(2)])
            sink.mark_committed(1)

        nursery.start_soon(another_tier_emits_then_spool_commits_only_1)
        await agent.persist_engine()
        saved = engine.load_state(agent.engine_path.read_bytes())
        assert saved.seq == 1  # not 2: a crash now must let a restart detect transition 2 again
        sink.mark_committed(2)
        await agent.persist_engine()  # still dirty: the newer state is saved once the spool holds it
        assert engine.load_state(agent.engine_path.read_bytes()).seq == 2


# ---- built from a SinkContext --------------------------------------------------------------------------------
CONTEXT_CONFIG = """
node: {node}
stateDir: {state}
history: {{enabled: true}}
sinks:
  webhook: [{{url: "http://127.0.0.1:9/hook"}}]
  nvsentinel: {{enabled: true, socketPath: {state}/pc.sock, tokenPath: ""}}
"""


def loaded(tmp_path: Path, node: str, state: str) -> LoadedConfig:
    text = CONTEXT_CONFIG.format(node=node, state=tmp_path / state)
    return parse_config(text, "t.yaml", env={})


@pytest.mark.parametrize(
    ("node", "state", "changed"),
    [
        ("node-b", "a", {"nvsentinel", "history"}),
        ("node-a", "b", {"nvsentinel", "history", "webhook:127.0.0.1:9"}),
        ("node-a", "a", set()),
    ],
    ids=["node", "stateDir", "nothing"],
)
def test_a_fingerprint_is_what_the_sink_was_built_from(
    tmp_path: Path, node: str, state: str, changed: set[str]
) -> None:
    """A running sink's fingerprint does not follow the agent: the reload compares it with one built from the new
    config, and replaces exactly the sinks that use what changed."""
    agent = Agent(loaded(tmp_path, "node-a", "a"))
    running = {s.name: s for s in build_sinks(agent.sink_context())}
    before = {name: s.fingerprint() for name, s in running.items()}
    assert set(before) == {"stream", "history", "nvsentinel", "webhook:127.0.0.1:9"}
    agent.loaded = loaded(tmp_path, node, state)  # what a reload applies before it syncs the sinks
    assert {name: s.fingerprint() for name, s in running.items()} == before
    rebuilt = {s.name: s.fingerprint() for s in build_sinks(agent.sink_context())}
    assert {name for name in before if rebuilt[name] != before[name]} == changed


def test_a_stream_ping_change_replaces_the_hub(tmp_path: Path) -> None:
    """The websocket routes read pingSeconds from the running hub: a reload changing only it must replace the hub."""

    def hub_fingerprint(extra: str) -> Hashable:
        agent = Agent(parse_config(f"stateDir: {tmp_path}\n{extra}", "t.yaml", env={}))
        (hub,) = [s for s in build_sinks(agent.sink_context()) if s.name == "stream"]
        return hub.fingerprint()

    assert hub_fingerprint("sinks: {stream: {pingSeconds: 30}}\n") == hub_fingerprint(
        "sinks: {stream: {pingSeconds: 30}}\n"
    )
    assert hub_fingerprint("sinks: {stream: {pingSeconds: 30}}\n") != hub_fingerprint(
        "sinks: {stream: {pingSeconds: 5}}\n"
    )


async def test_typed_handles_follow_the_sinks(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    agent = Agent(parse_config(f"stateDir: {tmp_path}\nhistory: {{enabled: true}}\n", "t.yaml", env={}))
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        assert isinstance(agent.history, HistorySink) and agent.history is agent.sinks["history"]
        assert isinstance(agent.stream, StreamHub) and agent.stream is agent.sinks["stream"]
        agent.loaded = parse_config(f"stateDir: {tmp_path}\nsinks: {{stream: {{enabled: false}}}}\n", "t.yaml", env={})
        await agent.sync_sinks()
        assert agent.history is None and agent.stream is None and agent.sinks == {}
        nursery.cancel_scope.cancel()
