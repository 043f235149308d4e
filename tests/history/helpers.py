"""Shared helpers: an agent with history enabled, a settable wall clock, a sink's task running, snapshots with
chosen timestamps."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.history.service import HistorySink
from nvdaemon.model import Sample, TierSnapshot

T0 = 1_700_000_400  # a window boundary for 1, 5 and 10 minute windows


class Wall:
    """An injected wall clock the test moves by hand."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_agent(tmp_path: Path, history: str = "{enabled: true}", extra: str = "") -> Agent:
    text = f"node: n1\nstateDir: {tmp_path / 'state'}\nshutdownGraceSeconds: 4\nhistory: {history}\n{extra}"
    return Agent(parse_config(text, "test.yaml", env={}))


def make_sink(agent: Agent, wall: Wall) -> HistorySink:
    return HistorySink(agent.sink_context(), wall=wall)


@asynccontextmanager
async def serving(sink: HistorySink) -> AsyncIterator[HistorySink]:
    """The sink's task running (its store open) for the body, then stopped as SIGTERM or a reload stops it."""
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.serve)
        yield sink
        nursery.cancel_scope.cancel()


def snap(*samples: tuple[str, str, float, float]) -> TierSnapshot:
    """Samples as (metric, device, value, timestamp)."""
    made = [Sample(m, d, v, tier="gpu", timestamp=ts) for m, d, v, ts in samples]
    return TierSnapshot("gpu", made, {}, collected_at=max((s[3] for s in samples), default=0.0), duration=0.0)


def temps(device: str, *pairs: tuple[float, float]) -> TierSnapshot:
    """gpu_temperature_celsius samples of one device as (value, timestamp)."""
    return snap(*(("gpu_temperature_celsius", device, v, ts) for v, ts in pairs))
