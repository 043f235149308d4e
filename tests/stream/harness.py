"""A real server in process (hypercorn + quart-trio on 127.0.0.1:0, the stream hub under a supervisor) and helpers
to publish events and talk to it with real trio-websocket clients."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import trio
import trio_websocket

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.sinks.stream.hub import StreamHub
from nvdaemon.supervise import Supervisor


def make_event(
    i: int,
    *,
    severity: str = "warning",
    condition: str = "load_high",
    device: str = "cpu",
    tier: str = "core",
    phase: Phase = Phase.ENTER,
) -> Event:
    detail: dict[str, object] = {"value": float(i), "threshold": 0.5, "metric": "load1", "labels": {}}
    started = 1_700_000_000.0 + i
    ended = started + 60 if phase is Phase.EXIT else None
    return Event(new_event_id(), "n1", tier, device, condition, phase, severity, i, started, ended, detail)


@dataclass
class Server:
    agent: Agent
    host: str
    port: int

    @property
    def hub(self) -> StreamHub:
        hub = self.agent.sinks["stream"]
        assert isinstance(hub, StreamHub)
        return hub

    def resource(self, **params: Any) -> str:
        query = urlencode({k: v for k, v in params.items() if v is not None})
        return "/v1/events" + (f"?{query}" if query else "")

    def connect(
        self, headers: list[tuple[bytes, bytes]] | None = None, **params: Any
    ) -> Any:  # an async context manager yielding a WebSocketConnection
        return trio_websocket.open_websocket(
            self.host, self.port, self.resource(**params), use_ssl=False, extra_headers=headers
        )

    async def publish(self, events: list[Event], batch: int = 200) -> None:
        """Publish as the engine does (never waiting), yielding between batches so the hub keeps up with the bus."""
        for start in range(0, len(events), batch):
            for ev in events[start : start + batch]:
                self.agent.bus.publish(ev)
            await trio.sleep(0)
            await trio.testing.wait_all_tasks_blocked()


@asynccontextmanager
async def running(tmp_path: Path, stream: str = "{}", extra: str = "", sinks: str = "") -> AsyncIterator[Server]:
    """An agent with the HTTP server and its sinks running; on exit, stopped in Agent.run's order. ``sinks`` adds
    entries to the ``sinks`` mapping (``webhook: [...]``)."""
    more = f", {sinks}" if sinks else ""
    text = (
        f"node: n1\nstateDir: {tmp_path / 'state'}\n"
        f"sinks: {{metrics: {{listenAddr: '127.0.0.1:0'}}, stream: {stream}{more}}}\n{extra}"
    )
    agent = Agent(parse_config(text, "test.yaml", env={}))
    async with trio.open_nursery() as nursery:
        agent.supervisor = sup = Supervisor(nursery)
        await agent.start_http(None)
        await agent.sync_sinks()
        host, _, port = agent.bound[0].removeprefix("http://").rpartition(":")
        try:
            yield Server(agent, host, int(port))
        finally:
            sup.stopping = True
            for name in [n for n in sup.tasks if n != "http"]:
                await sup.stop(name)
            agent.http_shutdown.set()
            await sup.tasks["http"].done.wait()
            nursery.cancel_scope.cancel()


async def receive(ws: trio_websocket.WebSocketConnection, n: int, timeout: float = 10) -> list[dict[str, Any]]:
    out = []
    with trio.fail_after(timeout):
        for _ in range(n):
            out.append(json.loads(await ws.get_message()))
    return out


async def nothing_more(ws: trio_websocket.WebSocketConnection, wait: float = 0.2) -> bool:
    with trio.move_on_after(wait):
        await ws.get_message()
        return False
    return True


def metric_value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not in exposition")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
