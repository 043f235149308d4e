"""The collection runner: timeouts, hung reads, absent vs broken sources, partial samples."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import ClassVar

import pytest
import trio
import trio.testing

from nvdaemon.collectors.base import (
    CYCLE_READS,
    Collector,
    CycleReads,
    Gathered,
    HostRoots,
    Interpreted,
    NotPresent,
    ParseError,
    interpreted,
)
from nvdaemon.model import Sample
from nvdaemon.tiers import STILL_READING, CollectorRunner, collect_tier
from nvdaemon.worker_thread import ReusableThread

ROOTS = HostRoots()


class Fake(Collector):
    name: ClassVar[str] = "fake"

    def __init__(self, behaviour: str, release: threading.Event | None = None) -> None:
        self.behaviour = behaviour
        self.release = release
        self.entered = threading.Event()
        self.calls = 0
        self.threads: list[int] = []  # the thread each gather ran in

    def gather(self, roots: HostRoots) -> Gathered:
        self.calls += 1
        self.threads.append(threading.get_ident())
        if self.behaviour == "absent":
            raise NotPresent("no such thing")
        if self.behaviour == "broken":
            raise ParseError("/proc/fake: line 1: bad")
        if self.behaviour == "hang":
            assert self.release is not None
            self.entered.set()
            self.release.wait(30)
        errors = ["chip1/temp2_input: EIO"] if self.behaviour == "partial" else []
        return Gathered(data=[1.0, 2.0], errors=errors)

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        if self.behaviour == "bad-interpret":
            raise KeyError("x")
        return interpreted(Sample("m", f"d{i}", v, timestamp=now) for i, v in enumerate(gathered.data))


class Other(Fake):
    name: ClassVar[str] = "other"


class Missing(Fake):
    """A collector that may hang whose source the node lacks, as a listing on the loop tells (no hwmon chip)."""

    name: ClassVar[str] = "missing"

    def present(self, roots: HostRoots) -> bool:
        return False


class Calm(Fake):
    """A collector whose reads cannot hang (a /proc file): read on the loop, no worker thread."""

    name: ClassVar[str] = "calm"
    may_hang: ClassVar[bool] = False


async def run_alone(runner: CollectorRunner, timeout: float) -> list[Sample]:
    """One tier cycle with only this collector in it."""
    snap = await collect_tier("core", [runner], ROOTS, timeout)
    assert all(s.timestamp == snap.collected_at for s in snap.samples)
    return list(snap.samples)


async def run_once(collector: Collector, timeout: float = 1.0) -> tuple[CollectorRunner, list[Sample]]:
    runner = CollectorRunner(collector, trio.CapacityLimiter(2))
    return runner, await run_alone(runner, timeout)


async def test_healthy_collector() -> None:
    runner, samples = await run_once(Fake("ok"))
    assert [s.value for s in samples] == [1.0, 2.0]
    assert runner.status.success and runner.status.present and runner.status.errors == ()


async def test_absent_source_is_not_an_error() -> None:
    runner, samples = await run_once(Fake("absent"))
    assert samples == []
    assert runner.status.success is True and runner.status.present is False


async def test_broken_source_is_an_error() -> None:
    runner, samples = await run_once(Fake("broken"))
    assert samples == []
    assert runner.status.success is False and runner.status.present is True
    assert runner.status.errors == ("ParseError: /proc/fake: line 1: bad",)
    assert runner.status.error_total == 1


async def test_partial_failure_keeps_samples_and_counts_error() -> None:
    runner, samples = await run_once(Fake("partial"))
    assert len(samples) == 2
    assert runner.status.success is False and runner.status.error_total == 1


async def test_interpret_failure_is_contained() -> None:
    runner, samples = await run_once(Fake("bad-interpret"))
    assert samples == [] and runner.status.errors[0].startswith("interpret: KeyError")


async def test_hung_read_times_out_then_is_skipped_until_it_returns(caplog: pytest.LogCaptureFixture) -> None:
    # Real time on purpose: a mock clock jumps while the loop waits on a worker thread, so every read would "time out".
    release = threading.Event()
    fake = Fake("hang", release)
    runner = CollectorRunner(fake, trio.CapacityLimiter(2))
    with caplog.at_level(logging.WARNING):
        assert await run_alone(runner, 0.2) == []
    assert runner.status.errors == ("read timed out after 0.2s",)
    # On a loaded machine the worker thread may start after the (mock-clock) timeout: wait until it is stuck.
    assert await trio.to_thread.run_sync(fake.entered.wait, 30)
    # The thread is still stuck: the next tick does not start a second one.
    assert await run_alone(runner, 0.2) == []
    assert "previous read has not returned" in runner.status.errors[0]
    assert fake.calls == 1
    release.set()
    for _ in range(1000):  # let the abandoned thread finish (real time, outside the mock clock)
        if not runner.in_flight:
            break
        await trio.to_thread.run_sync(time.sleep, 0.01)
    assert not runner.in_flight
    fake.behaviour = "ok"
    samples = await run_alone(runner, 30.0)
    assert not runner.status.errors
    assert len(samples) == 2 and runner.status.success
    # The same failure is logged when it changes, not every tick.
    assert sum("timed out" in r.getMessage() for r in caplog.records) == 1


async def test_collect_tier_keeps_others_when_one_fails() -> None:
    limiter = trio.CapacityLimiter(4)
    runners = [CollectorRunner(Fake("broken"), limiter), CollectorRunner(Other("ok"), limiter)]
    snap = await collect_tier("core", runners, ROOTS, 1.0)
    assert len(snap.samples) == 2
    assert snap.collectors["fake"].success is False and snap.collectors["other"].success is True
    assert all(s.timestamp == snap.collected_at for s in snap.samples)


async def test_a_hung_collector_in_the_tier_batch_costs_only_itself() -> None:
    # Real time, as above. The tier's collectors share one worker thread; the hung one is first in line.
    release = threading.Event()
    hung = Fake("hang", release)
    limiter = trio.CapacityLimiter(4)
    other = Other("ok")
    runners = [CollectorRunner(hung, limiter), CollectorRunner(other, limiter)]
    snap = await collect_tier("core", runners, ROOTS, 0.2)
    assert snap.collectors["fake"].errors == ("read timed out after 0.2s",)
    assert snap.collectors["other"].errors == ("not read this tick: collector fake was still reading",)
    assert await trio.to_thread.run_sync(hung.entered.wait, 30)
    # Next tick: the hung read is skipped, not started again, and the others run.
    snap = await collect_tier("core", runners, ROOTS, 0.2)
    assert STILL_READING in snap.collectors["fake"].errors[0]
    assert snap.collectors["other"].success and len(snap.samples) == 2
    assert hung.calls == 1
    release.set()
    calls = other.calls
    for _ in range(1000):  # the abandoned thread returns and stops: it does not go on to "other"
        if not runners[0].in_flight:
            break
        await trio.to_thread.run_sync(time.sleep, 0.01)
    await trio.to_thread.run_sync(time.sleep, 0.1)  # room for a (wrong) stale gather of "other" to happen
    assert other.calls == calls
    hung.behaviour = "ok"
    snap = await collect_tier("core", runners, ROOTS, 30.0)
    assert snap.collectors["fake"].success and snap.collectors["other"].success
    assert len(snap.samples) == 4


async def test_reads_that_cannot_hang_run_on_the_loop_and_a_hung_read_does_not_hold_them() -> None:
    # Real time, as above. The hung collector comes first; the one that cannot hang is read on the loop all the same.
    release = threading.Event()
    hung = Fake("hang", release)
    calm = Calm("ok")
    limiter = trio.CapacityLimiter(4)
    runners = [CollectorRunner(hung, limiter), CollectorRunner(calm, limiter)]
    loop_thread = threading.get_ident()
    try:
        snap = await collect_tier("core", runners, ROOTS, 0.2)
        assert snap.collectors["fake"].errors == ("read timed out after 0.2s",)
        assert snap.collectors["calm"].success and len(snap.samples) == 2
        assert calm.threads == [loop_thread]
        assert await trio.to_thread.run_sync(hung.entered.wait, 30)
        assert hung.threads != [loop_thread]  # the one that may hang was read in a worker thread
        # Next tick, the hung read still stuck: skipped, and the calm one read again on the loop.
        snap = await collect_tier("core", runners, ROOTS, 0.2)
        assert STILL_READING in snap.collectors["fake"].errors[0]
        assert snap.collectors["calm"].success and calm.threads == [loop_thread] * 2
    finally:
        release.set()


async def test_a_source_the_node_lacks_is_reported_absent_without_a_gather() -> None:
    missing = Missing("ok")
    runner, samples = await run_once(missing)
    assert missing.calls == 0 and samples == []
    assert runner.status.present is False and runner.status.success and runner.status.errors == ()


async def test_a_tier_loop_reads_in_the_same_thread_every_tick_until_one_hangs() -> None:
    # Real time, as above. The tier loop's worker thread is kept between ticks (a new thread per tick cost more CPU
    # than handing work to a waiting one); a hung read keeps its thread and the next tick gets another.
    worker = ReusableThread("tier core")
    release = threading.Event()
    fake, other = Fake("ok", release), Other("ok")
    limiter = trio.CapacityLimiter(4)
    runners = [CollectorRunner(fake, limiter), CollectorRunner(other, limiter)]
    try:
        for _ in range(3):
            snap = await collect_tier("core", runners, ROOTS, 30.0, worker)
            assert snap.collectors["fake"].success and snap.collectors["other"].success
            while not worker.free():  # the thread hands the result back, then waits for work (ticks are 15 s apart)
                await trio.sleep(0.001)
        assert len(set(fake.threads + other.threads)) == 1 and worker.started == 1
        fake.behaviour = "hang"
        snap = await collect_tier("core", runners, ROOTS, 0.2, worker)
        assert snap.collectors["fake"].errors == ("read timed out after 0.2s",)
        snap = await collect_tier("core", runners, ROOTS, 30.0, worker)
        assert STILL_READING in snap.collectors["fake"].errors[0] and snap.collectors["other"].success
        assert worker.started == 2 and other.threads[-1] != fake.threads[-1]
    finally:
        release.set()


class Remembers(Fake):
    """Keeps a weak reference to the cycle's read cache each gather sees."""

    name: ClassVar[str] = "remembers"

    def __init__(self) -> None:
        super().__init__("ok")
        self.caches: list[weakref.ref[CycleReads]] = []

    def gather(self, roots: HostRoots) -> Gathered:
        reads = CYCLE_READS.get()
        assert reads is not None
        self.caches.append(weakref.ref(reads))
        return super().gather(roots)


async def test_the_cycles_read_cache_is_gone_when_the_tick_is_back_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker thread drops the context it ran the batch in (and with it the cycle's read cache: every text of
    # the cycle) before it hands the result back, not when it next gets the GIL: the tick goes on, and the garbage
    # collection after its pause walks whatever is still alive then. Here the worker thread is held right after
    # it hands the result back, until the loop has looked.
    hand_back = trio.lowlevel.TrioToken.run_sync_soon
    looked = threading.Event()

    def held_after(self: trio.lowlevel.TrioToken, *args: object, **kw: bool) -> None:
        hand_back(self, *args, **kw)  # type: ignore[arg-type]
        if threading.current_thread().name.startswith("tier core"):
            looked.wait(10)

    monkeypatch.setattr(trio.lowlevel.TrioToken, "run_sync_soon", held_after)
    worker = ReusableThread("tier core")
    collector = Remembers()
    runners = [CollectorRunner(collector, trio.CapacityLimiter(4))]
    for _ in range(3):
        looked.clear()
        snap = await collect_tier("core", runners, ROOTS, 30.0, worker)
        assert snap.collectors["remembers"].success
        gone = collector.caches[-1]() is None  # no checkpoint since the batch came back
        looked.set()
        assert gone
        while not worker.free():
            await trio.sleep(0.001)
