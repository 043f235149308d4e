"""A sink replaced by a reload hands what it still holds and its counters to its successor (``Sink.take_over``).

Each test runs the agent's own ``sync_sinks`` under a real ``Supervisor``: a first config starts the sink, a second
one that differs in one setting of that sink replaces it. The event that matters is emitted right after the old
sink's task has stopped and before the new one is subscribed (``Supervisor.stop`` wrapped), which is where a reload
storm lost events: it is in the old sink's bus channel, which nothing reads any more.

- webhook (a real receiver on loopback): the events the old endpoint held only in memory (its spool refused writes)
  and the one left in its channel are delivered by the new one, in order; no ``unspooled_at_stop`` drop; attempts,
  drops and the latency histogram carry on; a persist waiting on the old endpoint returns once the new one spooled;
- the websocket hub: its ring buffer and channel carry over, so a client resumes with ``since=`` without a gap;
- NVSentinel: its send counters carry on and an XID left in its channel is known to the new sink;
- history: its counters carry on and a window ingested after its final flush is the new sink's to write.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.gpu.events import XID_CONDITION
from nvdaemon.history.service import HistorySink
from nvdaemon.model import Event, Phase, Sample, TierSnapshot
from nvdaemon.server.self_metrics import delivery_dropped
from nvdaemon.sinks.nvsentinel.sink import NvsentinelHealthSink
from nvdaemon.sinks.stream.hub import Cursor, Filters, StreamHub
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.spool import SpoolDB
from nvdaemon.supervise import Supervisor
from tests import polling

from ..test_e2e import free_port
from .helpers import disk_full, event
from .receiver import Receiver

until = functools.partial(polling.until, timeout=20.0)


def make_agent(tmp_path: Path, sinks: str, extra: str = "") -> Agent:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"node: n1\ntiers: [core, gpu]\nstateDir: {tmp_path / 'state'}\n"
        f"sinks:\n  metrics: {{listenAddr: '127.0.0.1:{free_port()}'}}\n{sinks}{extra}"
    )
    return Agent(parse_config(config.read_text(), str(config), env={}), config_path=str(config))


async def replace(agent: Agent, new: Agent, monkeypatch: pytest.MonkeyPatch, after_stop: Callable[[], None]) -> None:
    """Apply ``new``'s config the way a reload does (``sync_sinks``), calling ``after_stop`` once the replaced sink's
    task has stopped (what a tier loop emitting at that moment does)."""
    sup = agent.supervisor
    assert sup is not None
    stop = sup.stop

    async def stop_then(name: str) -> None:
        await stop(name)
        after_stop()

    monkeypatch.setattr(sup, "stop", stop_then)
    agent.loaded = new.loaded
    await agent.sync_sinks()
    monkeypatch.setattr(sup, "stop", stop)


def delivered(rx: Receiver) -> list[int]:
    with rx.lock:
        return [int(r.data["seq"]) for r in rx.received if r.answered == 200]


def dropped_logged(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [d for r in caplog.records if (d := getattr(r, "dropped", None))]


async def test_a_replaced_webhook_endpoint_hands_its_backlog_and_counters_to_its_successor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "nvdaemon.sinks.webhook.metrics")

    def webhook(timeout: int) -> str:
        return (
            f"  stream: {{enabled: false}}\n  webhook:\n    - {{url: '{rx.url}', timeoutSeconds: {timeout}, "
            "maxAttempts: 1, backoffBaseSeconds: 0.05, backoffMaxSeconds: 0.2}\n"
        )

    with Receiver() as rx:
        agent = make_agent(tmp_path, webhook(5))
        async with trio.open_nursery() as nursery:
            agent.supervisor = Supervisor(nursery)
            await agent.sync_sinks()
            (old,) = [s for s in agent.sinks.values() if isinstance(s, WebhookEndpoint)]
            rx.script = [400]
            agent.emit([event(1)])  # rejected: a dead letter, counted as dropped
            agent.emit([event(2)])
            await until(lambda: old.attempts == {"rejected": 1, "success": 1})
            before = delivery_dropped(agent).samples[0].value
            assert before == 1

            real_add = SpoolDB.add
            monkeypatch.setattr(SpoolDB, "add", lambda *a, **k: (_ for _ in ()).throw(disk_full()))
            agent.emit([event(3), event(4)])
            await until(lambda: len(old.writer.buffer) == 2)  # held in memory: the stateDir refuses them
            persisted = trio.Event()

            async def persist_waiter() -> None:
                await old.wait_committed(5)  # what Agent.persist_engine waits on
                persisted.set()

            nursery.start_soon(persist_waiter)
            await replace(agent, make_agent(tmp_path, webhook(6)), monkeypatch, lambda: agent.emit([event(5)]))
            monkeypatch.setattr(SpoolDB, "add", real_add)  # writable again
            (new,) = [s for s in agent.sinks.values() if isinstance(s, WebhookEndpoint)]
            assert new is not old and new.name == old.name
            agent.emit([event(6)])
            await until(lambda: 6 in delivered(rx), "event 6 delivered")
            assert delivered(rx) == [2, 3, 4, 5, 6]  # what the old endpoint held, in order, then the new event
            assert [d["reason"] for d in dropped_logged(caplog)] == ["rejected"]  # nothing unspooled_at_stop
            assert delivery_dropped(agent).samples[0].value == before  # carried on, never back to 0
            await until(persisted.is_set, "a persist waiting on the replaced endpoint returned")
            await until(lambda: new.attempts.get("success") == 5, "the last success counted")
            nursery.cancel_scope.cancel()
    assert new.dropped == {"rejected": 1}
    assert new.attempts == {"rejected": 1, "success": 5}
    assert new.latency.count == 5
    assert new.state()["unspooled"] == 0


async def test_a_replaced_stream_hub_hands_its_ring_buffer_and_counters_so_clients_resume_without_a_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(tmp_path, "  stream: {bufferSize: 100}\n")
    events = [event(i) for i in range(1, 5)]
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        old = agent.stream
        assert old is not None
        client, _ = old.connect(Filters(), Cursor())
        agent.emit(events[:3])
        await until(lambda: old.messages == 3)
        old.disconnect(client)
        await replace(
            agent, make_agent(tmp_path, "  stream: {bufferSize: 50}\n"), monkeypatch, lambda: agent.emit(events[3:])
        )
        new = agent.stream
        assert isinstance(new, StreamHub) and new is not old
        assert [ev.id for ev, _ in new.buffer] == [ev.id for ev in events]
        assert new.messages == 3
        _, replay = new.connect(Filters(), Cursor(since=events[1].id))
        assert not replay.unknown_cursor
        assert len(replay.messages) == 2 and events[3].id in replay.messages[1].text
        nursery.cancel_scope.cancel()


def xid_event(seq: int) -> Event:
    detail: dict[str, object] = {"xid": 79, "description": "fallen off the bus", "pci_bus_id": "0000:3b:00.0"}
    detail["gpu_uuid"] = "GPU-1234"
    at = time.time()
    return Event(f"x{seq}", "n1", "gpu", "gpu0", XID_CONDITION, Phase.ENTER, "critical", seq, at, detail=detail)


async def test_a_replaced_nvsentinel_sink_hands_its_counters_and_unread_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def nvsentinel(interval: float) -> tuple[str, str]:
        sinks = f"  stream: {{enabled: false}}\n  nvsentinel: {{enabled: true, socketPath: {tmp_path / 'pc.sock'}}}\n"
        return sinks, f"intervalSeconds: {interval}\ngpu: {{xid: true}}\n"

    agent = make_agent(tmp_path, *nvsentinel(1))
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        old = agent.sinks["nvsentinel"]
        assert isinstance(old, NvsentinelHealthSink)
        await until(lambda: old.reconciler.reconciles > 0)
        per_pass = old.reconciler.skipped  # no platform-connector: the baseline sends are skipped
        assert per_pass > 0
        # More skips than the new sink's first passes could make alone: only a carried count gets past them.
        await until(lambda: old.reconciler.skipped >= 10 * per_pass)
        await replace(agent, make_agent(tmp_path, *nvsentinel(2)), monkeypatch, lambda: agent.emit([xid_event(1)]))
        skipped = old.reconciler.skipped
        new = agent.sinks["nvsentinel"]
        assert isinstance(new, NvsentinelHealthSink) and new is not old
        await until(lambda: new.reconciler.reconciles > 0)
        assert new.reconciler.reconciles < 10 and new.reconciler.skipped > skipped
        assert [x.xid for x in new.reconciler.xids.values()] == [79]
        nursery.cancel_scope.cancel()


async def test_a_replaced_history_sink_hands_its_counters_and_the_windows_it_still_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hour_ago = time.time() - 3600  # complete windows: the final flush writes them

    def snap(ts: float) -> TierSnapshot:
        sample = Sample("gpu_temperature_celsius", "gpu0", 60.0, tier="gpu", timestamp=ts)
        return TierSnapshot("gpu", [sample], {}, ts, 0)

    def ingest_late() -> None:
        assert agent.history is not None
        agent.history.ingest(snap(hour_ago + 60))  # after the old sink's final flush, before the handles move

    agent = make_agent(tmp_path, "  stream: {enabled: false}\n", "history: {enabled: true, retentionDays: 7}\n")
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        old = agent.history
        assert old is not None
        old.ingest(snap(hour_ago))
        history = "history: {enabled: true, retentionDays: 8}\n"
        new_config = make_agent(tmp_path, "  stream: {enabled: false}\n", history)
        await replace(agent, new_config, monkeypatch, ingest_late)
        new = agent.history
        assert isinstance(new, HistorySink) and new is not old
        assert old.points_written == 1
        assert new.points_written == 1  # carried on, not back to 0
        await until(lambda: new.store is not None)
        assert await new.flush() == 1  # the late window, written by the new sink
        assert new.points_written == 2
        nursery.cancel_scope.cancel()
