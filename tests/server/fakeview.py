"""A small read-only view for the server's tests (``nvdaemon.view.AgentView``), built from a config text, with no
``Agent``: the test sets its values through ``update`` or ``take``; anything else that assigns to it (the server)
gets an AttributeError."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from nvdaemon import engine
from nvdaemon.bus import EventBus
from nvdaemon.config import LoadedConfig
from nvdaemon.configload import parse_config
from nvdaemon.gpu import GpuRuntime
from nvdaemon.history.service import HistorySink
from nvdaemon.model import TierSnapshot, new_event_id
from nvdaemon.server.app import Listening, serve_http
from nvdaemon.sinks.stream.hub import StreamHub
from nvdaemon.supervise import TaskState
from nvdaemon.view import AgentView, EventKey, SinkView, Surfaces


@dataclass
class FakeView:
    loaded: LoadedConfig  # the test's config: the fake derives the view's values from it, as the agent does
    snapshots: dict[str, TierSnapshot] = field(default_factory=dict)
    engine: engine.EngineState = field(default_factory=engine.EngineState)
    bus: EventBus = field(default_factory=EventBus)
    event_counts: collections.Counter[EventKey] = field(default_factory=collections.Counter)
    sinks: dict[str, SinkView] = field(default_factory=dict)
    tasks: dict[str, TaskState] = field(default_factory=dict)
    history: HistorySink | None = None
    stream: StreamHub | None = None
    gpu: GpuRuntime | None = None
    kmsg: None = None  # the kernel-log source: off
    ready: bool = False
    stopping: trio.Event = field(default_factory=trio.Event)
    started_at: float = 1_700_000_000.0
    ticks: dict[str, int] = field(default_factory=dict)
    snapshot_version: int = 0
    changes: int = 0
    reloads: int = 0
    reload_failures: int = 0
    last_reload_ok: bool = True
    problems: list[str] = field(default_factory=list)
    snapshot_waiters: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_sealed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if getattr(self, "_sealed", False):
            raise AttributeError(f"{name}: the server's view is read-only")
        object.__setattr__(self, name, value)

    def update(self, **values: Any) -> None:
        """What the agent would change (the test's hand, never the server's)."""
        for name, value in values.items():
            object.__setattr__(self, name, value)
        if "snapshot_version" in values:
            self.snapshot_waiters.unpark_all()

    async def next_snapshot(self, seen: int) -> int:
        while self.snapshot_version <= seen:
            await self.snapshot_waiters.park()
        return self.snapshot_version

    @property
    def node(self) -> str:
        return self.loaded.node

    @property
    def config_source(self) -> str:
        return self.loaded.source

    @property
    def surfaces(self) -> Surfaces:
        c = self.loaded.config
        return Surfaces(c.dcgm_compat.enabled, c.smartctl_compat.enabled, c.node_exporter.enabled)

    def active_tiers(self) -> list[str]:
        return list(self.loaded.tiers)

    def interval(self, tier: str) -> float:
        c = self.loaded.config
        return c.smart.interval_seconds if tier == "smart" else c.interval_seconds

    def health_problems(self) -> list[str]:
        return list(self.problems)

    def take(self, snap: TierSnapshot) -> None:
        """A tier's new snapshot, as the agent takes one: kept, and the config's rules evaluated over it."""
        self.snapshots[snap.tier] = snap
        rules = engine.compile_rules(self.loaded.config.rules)
        kw: dict[str, Any] = {"tier": snap.tier, "node": self.node, "now": snap.collected_at}
        events = engine.evaluate(self.engine, rules, snap.samples, new_id=new_event_id, **kw)
        for ev in events:
            self.event_counts[ev.count_key()] += 1
            self.bus.publish(ev)
        self.ticks[snap.tier] = self.ticks.get(snap.tier, 0) + 1
        self.update(snapshot_version=self.snapshot_version + 1)


def as_view(fake: FakeView) -> AgentView:
    return fake  # mypy checks here that the fake is an AgentView


def make_view(tmp_path: Path, extra: str = "") -> FakeView:
    text = f"node: n1\nstateDir: {tmp_path / 'state'}\nintervalSeconds: 10\n{extra}"
    return FakeView(parse_config(text, "test.yaml", env={}))


def serve(view: FakeView, stop: trio.Event) -> partial[Any]:
    """``serve_http`` for ``nursery.start`` / ``Supervisor.start``, with ``view``'s config; ``stop`` ends it."""
    c = view.loaded.config
    return partial(
        serve_http,
        as_view(view),
        c.server,
        c.sinks.metrics.listen_addr,
        shutdown_grace_seconds=c.shutdown_grace_seconds,
        shutdown_trigger=stop.wait,
    )


def address(listening: Listening) -> tuple[str, int]:
    host, _, port = listening.bound[0].removeprefix("http://").rpartition(":")
    return host, int(port)
