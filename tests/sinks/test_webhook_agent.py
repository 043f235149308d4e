"""The webhook endpoints inside an in-process ``Agent``: a reload that replaces them, and a stop while the stateDir
refuses writes. Either way every emitted event is in the spool or dropped and counted with its id: emitted =
delivered + counted drops (nothing is delivered here: the receiver's loopback port has no listener)."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.spool import FILE, SpoolDB
from nvdaemon.supervise import Supervisor
from tests import polling

from ..test_e2e import free_port
from .helpers import SECRET, disk_full, event


def write_config(tmp_path: Path, ports: list[int], max_events: int) -> Agent:
    hooks = "".join(f"    - {{url: 'http://127.0.0.1:{p}/hook', secret: '{SECRET}'}}\n" for p in ports)
    config = tmp_path / "config.yaml"
    config.write_text(
        f"node: n1\ntiers: []\nstateDir: {tmp_path / 'state'}\nspool: {{maxEvents: {max_events}}}\n"
        f"sinks:\n  stream: {{enabled: false}}\n  metrics: {{listenAddr: '127.0.0.1:{free_port()}'}}\n"
        f"  webhook:\n{hooks}rules: []\n"
        # The host's kernel log (read as root) would add events of its own while the spool refuses writes.
        "kernelLog: {enabled: false}\n"
    )
    return Agent(parse_config(config.read_text(), str(config), env={}), config_path=str(config))


def endpoints(agent: Agent) -> list[WebhookEndpoint]:
    return [s for s in agent.sinks.values() if isinstance(s, WebhookEndpoint)]


def dropped_ids(caplog: pytest.LogCaptureFixture) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in caplog.records:
        if d := getattr(r, "dropped", None):
            out.setdefault(d["sink"], set()).update(d["ids"])
    return out


until = functools.partial(polling.until, timeout=20.0)


def spooled(state_dir: Path) -> dict[str, set[str]]:
    db = SpoolDB(state_dir / FILE)
    try:
        out: dict[str, set[str]] = {}
        for row in db.rows():
            out.setdefault(row.endpoint, set()).add(row.event_id)
        return out
    finally:
        db.close()


async def test_a_reload_replacing_two_endpoints_loses_no_event_published_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A changed spool bound replaces every endpoint; the tier loops keep emitting while each is stopped (here:
    one event as each stop begins). An endpoint replaced first must still get what is emitted while the next one
    stops."""
    caplog.set_level(logging.WARNING, "nvdaemon.sinks.webhook.metrics")
    ports = [free_port(), free_port()]
    agent = write_config(tmp_path, ports, 1000)
    emitted: list[str] = []
    async with trio.open_nursery() as nursery:
        agent.supervisor = sup = Supervisor(nursery)
        await agent.sync_sinks()
        names = [s.name for s in endpoints(agent)]
        assert len(names) == 2
        stop = sup.stop

        async def stop_while_emitting(name: str) -> Any:
            ev = event(len(emitted) + 1)
            emitted.append(ev.id)
            agent.emit([ev])
            return await stop(name)

        monkeypatch.setattr(sup, "stop", stop_while_emitting)
        agent.loaded = write_config(tmp_path, ports, 2000).loaded
        await agent.sync_sinks()
        monkeypatch.undo()
        assert len(emitted) == 2 and [s.name for s in endpoints(agent)] == names
        state = agent.loaded.state_dir

        def accounted() -> bool:
            held, dropped = spooled(state), dropped_ids(caplog)
            return all(set(emitted) <= held.get(n, set()) | dropped.get(n, set()) for n in names)

        await until(accounted)
        nursery.cancel_scope.cancel()


async def test_a_stop_while_the_state_dir_refuses_writes_counts_what_was_only_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "nvdaemon.sinks.webhook.metrics")
    agent = write_config(tmp_path, [free_port()], 1000)
    ids = [event(i).id for i in range(1, 6)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        with trio.fail_after(20):
            await agent.started.wait()
        (sink,) = endpoints(agent)

        def full(*args: Any, **kwargs: Any) -> Any:
            raise disk_full()

        monkeypatch.setattr(SpoolDB, "add", full)
        agent.emit([event(i) for i in range(1, 6)])
        await until(lambda: len(sink.writer.buffer) == 5 and sink.health.error is not None)
        agent.stopping.set()  # what SIGTERM does
    assert sink.dropped == {"unspooled_at_stop": 5}
    assert dropped_ids(caplog) == {sink.name: set(ids)}
