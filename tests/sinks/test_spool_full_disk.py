"""The stateDir on a real filesystem that refuses writes (a small tmpfs, full; a read-only one), with the agent's own
sinks, engine and status document in this process, a real receiver on loopback and real worker threads.

The probe of issue 15: the receiver down, the stateDir full, 1500 events emitted; then space freed and the receiver
back. Every event arrives or is counted as dropped (with its id logged), and ``engine.json`` is never saved past an
event the spool does not hold. Mounting needs root; elsewhere these tests skip and say so (the same paths are
covered with injected write errors in ``test_spool_failures``)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

import nvdaemon.app
from nvdaemon import engine
from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.model import Event, Phase
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.server.state import status_document
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.url import endpoint_names
from nvdaemon.supervise import Supervisor

from .helpers import SECRET, until
from .receiver import Receiver
from .storage import fill, tmpfs

CONFIG = """
node: probe-node
stateDir: {state}
sinks:
  webhook:
    - url: {url}
      secret: ${{PROBE_SECRET}}
      backoffBaseSeconds: 0.05
      backoffMaxSeconds: 0.2
"""
EVENTS = 1500
TICK = 50  # events per tier tick; engine state is saved after each, as serve_tier does


def probe_event(seq: int) -> Event:
    severity = ("info", "warning", "critical")[seq % 3]
    return Event(
        id=f"00000000-0000-7000-9000-{seq:012d}",
        node="probe-node",
        tier="core",
        device="cpu",
        condition="load_high",
        phase=Phase.ENTER,
        severity=severity,
        seq=seq,
        started_at=time.time(),
        detail={"value": float(seq), "threshold": 1.0, "metric": "load1"},
    )


@contextlib.asynccontextmanager
async def agent_with_webhook(state: Path, rx: Receiver) -> AsyncIterator[tuple[Agent, WebhookEndpoint]]:
    loaded = parse_config(CONFIG.format(state=state, url=rx.url), "probe.yaml", env={"PROBE_SECRET": SECRET})
    agent = Agent(loaded)
    (name,) = endpoint_names([rx.url])
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        sink = agent.sinks[name]
        assert isinstance(sink, WebhookEndpoint)
        yield agent, sink
        nursery.cancel_scope.cancel()


def saved_seq(agent: Agent) -> int:
    try:
        return engine.load_state(agent.engine_path.read_bytes()).seq
    except FileNotFoundError:
        return 0


def assert_not_saved_past_memory(agent: Agent, sink: WebhookEndpoint) -> int:
    saved = saved_seq(agent)
    assert saved <= sink.committed_seq
    unspooled = [i.seq for i in sink.writer.buffer.all()]
    assert all(seq > saved for seq in unspooled), (saved, unspooled[:5])
    return saved


async def test_full_state_dir_probe_nothing_lost_nothing_saved_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(nvdaemon.app, "DURABLE_WAIT_SECONDS", 0.1)  # 30 ticks, each waiting for a full spool
    caplog.set_level(logging.WARNING, "nvdaemon.sinks.webhook")
    rx = Receiver(secret=SECRET)  # the port is reserved; nothing listens yet: the receiver is down
    with tmpfs(tmp_path / "state", "256k") as state:
        try:
            async with agent_with_webhook(state, rx) as (agent, sink):
                await until(lambda: sink._spool is not None and sink._spool.db is not None)  # the sender's first read
                ballast = fill(state, leave=32 * 1024)
                emitted: list[Event] = []
                for first in range(1, EVENTS + 1, TICK):
                    batch = [probe_event(seq) for seq in range(first, first + TICK)]
                    for ev in batch:
                        agent.engine.seq = ev.seq
                        agent.emit([ev])
                    emitted += batch
                    await agent.persist_engine()
                    assert_not_saved_past_memory(agent, sink)
                    await trio.sleep(0.01)
                await until(lambda: len(sink.writer.buffer) > 0 and sink.health.error is not None)
                assert sink.committed_seq < EVENTS
                doc = status_document(agent)
                assert doc["sinks"][sink.name]["state"] == "degraded"
                full = ("database or disk is full", "No space left on device")
                assert doc["sinks"][sink.name]["storageError"] in full
                assert doc["tasks"][sink.name]["lastError"].startswith("spool not writable")
                assert doc["tasks"][sink.name]["state"] == "running" and doc["tasks"][sink.name]["restarts"] == 0
                text = MetricsCache(agent).render().decode()
                assert f'nodevitals_sink_state_writable{{sink="{sink.name}"}} 0.0' in text

                ballast.unlink()  # space freed
                rx.start()  # and the receiver back

                def settled() -> bool:
                    return len(set(rx.ids()) | dropped_ids(caplog)) >= EVENTS and sink.backlog == 0

                with trio.fail_after(120):
                    while not settled():
                        await agent.persist_engine()
                        assert_not_saved_past_memory(agent, sink)
                        await trio.sleep(0.1)
                await agent.persist_engine()
                assert saved_seq(agent) == EVENTS == sink.committed_seq
                assert sink.health.error is None and len(sink.writer.buffer) == 0
                text = MetricsCache(agent).render().decode()
                assert f'nodevitals_sink_state_writable{{sink="{sink.name}"}} 1.0' in text
                counted = sum(sink.dropped.values())
        finally:
            rx.stop()
    arrived = set(rx.ids())
    dropped = dropped_ids(caplog)
    assert {ev.id for ev in emitted} == arrived | dropped  # every event arrived or is a counted, logged drop
    assert not arrived & dropped and counted == len(dropped)  # emitted = delivered + counted drops, exactly
    assert all(r.verified for r in rx.received)


def dropped_ids(caplog: pytest.LogCaptureFixture) -> set[str]:
    return {i for r in caplog.records if (d := getattr(r, "dropped", None)) for i in d["ids"]}


async def test_read_only_state_dir_is_degraded_and_visible_not_a_crash_loop(tmp_path: Path) -> None:
    rx = Receiver(secret=SECRET)
    with tmpfs(tmp_path / "state", "64k", read_only=True) as state, rx:
        async with agent_with_webhook(state, rx) as (agent, sink):
            agent.engine.seq = 1
            agent.emit([probe_event(1)])
            await until(lambda: sink.health.failures >= 3, "three refused writes of the spool")
            await agent.persist_engine()  # not saved past event 1, which the spool does not hold
            assert not agent.engine_path.exists()
            doc = status_document(agent)
            task = doc["tasks"][sink.name]
            assert task["state"] == "running" and task["restarts"] == 0 and task["degraded"] is True
            assert "spool not writable" in task["lastError"]
            assert doc["sinks"][sink.name]["state"] == "degraded" and doc["sinks"][sink.name]["unspooled"] == 1
            assert sink.committed_seq == 0
            text = MetricsCache(agent).render().decode()
            assert f'nodevitals_sink_state_writable{{sink="{sink.name}"}} 0.0' in text
    assert rx.received == []


async def test_an_engine_state_write_refused_is_logged_and_retried_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    agent = Agent(parse_config(f"stateDir: {blocker / 'state'}\n", "t.yaml", env={}))
    agent.engine.seq = 1
    agent.emit([probe_event(1)])
    await agent.persist_engine()  # before: OSError out of the tier loop (a crash loop, /healthz failing)
    assert agent.engine_save_error is not None
    assert any("engine state not saved" in r.getMessage() for r in caplog.records)
    blocker.unlink()
    await agent.persist_engine()
    assert agent.engine_save_error is None and saved_seq(agent) == 1
