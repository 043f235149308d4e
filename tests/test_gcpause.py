"""Automatic garbage collection paused for a tick (``nvdaemon/gcpause.py``, ``app.tick``): off while the worker
thread reads and the snapshot is published, back on after, nested pauses counted, a caller's own choice kept, and
never left off by a read that hangs."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import ClassVar, cast

import pytest
import trio

from nvdaemon import gcpause
from nvdaemon.app import Agent, tick
from nvdaemon.collectors.base import Collector, Gathered, HostRoots, Interpreted, interpreted
from nvdaemon.model import Sample, TierSnapshot
from nvdaemon.tiers import CollectorRunner
from nvdaemon.worker_thread import ReusableThread


@pytest.fixture(autouse=True)
def collection_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    assert gcpause._pauses == 0
    if not was:
        gc.disable()


def test_pauses_nest_and_collection_resumes_when_the_last_ends() -> None:
    with gcpause.paused():
        assert not gc.isenabled()
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_in_the_block_resumes_collection() -> None:
    with pytest.raises(KeyError), gcpause.paused():
        raise KeyError("x")
    assert gc.isenabled()


def test_collection_the_caller_turned_off_stays_off() -> None:
    gc.disable()
    with gcpause.paused():
        pass
    assert not gc.isenabled()


class Sensor(Collector):
    """A collector read in the worker thread that notes whether collection was on, and may hang."""

    name: ClassVar[str] = "sensor"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.collecting: list[bool] = []

    def gather(self, roots: HostRoots) -> Gathered:
        self.collecting.append(gc.isenabled())
        self.entered.set()
        self.release.wait(30)
        return Gathered(data=[1.0])

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        return interpreted(Sample("m", "d", v, timestamp=now) for v in gathered.data)


class Publisher:
    """What ``tick`` asks of the agent: the host roots, and ``on_snapshot``."""

    roots = HostRoots()

    def __init__(self) -> None:
        self.collecting: list[bool] = []
        self.snapshots: list[TierSnapshot] = []

    def on_snapshot(self, snap: TierSnapshot) -> None:
        self.collecting.append(gc.isenabled())
        self.snapshots.append(snap)


async def test_a_tick_pauses_collection_while_it_reads_and_publishes() -> None:
    sensor, publisher = Sensor(), Publisher()
    runners = [CollectorRunner(sensor, trio.CapacityLimiter(2))]
    await tick(cast(Agent, publisher), "core", runners, 30.0, ReusableThread("tier core"))
    assert sensor.collecting == [False] and publisher.collecting == [False]
    assert len(publisher.snapshots[0].samples) == 1
    assert gc.isenabled()


async def test_a_read_that_hangs_does_not_keep_collection_off() -> None:
    # Real time on purpose, as tests/test_tiers.py's hung reads: the loop gives up on the thread at the deadline.
    sensor, publisher = Sensor(), Publisher()
    sensor.release.clear()
    runners = [CollectorRunner(sensor, trio.CapacityLimiter(2))]
    try:
        await tick(cast(Agent, publisher), "core", runners, 0.2, ReusableThread("tier core"))
        assert await trio.to_thread.run_sync(sensor.entered.wait, 30)
        assert runners[0].in_flight  # still reading
        assert gc.isenabled()
        assert runners[0].status.errors == ("read timed out after 0.2s",)
    finally:
        sensor.release.set()
