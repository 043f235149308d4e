"""Tier loops: run a tier's collectors every interval, publish the snapshot, feed the engine.

A collector whose reads cannot hang (``Collector.may_hang`` False: /proc text files and counters the kernel keeps in
memory) is read on the event loop, one after another: a worker-thread round trip costs more CPU than most of those
reads. The others read+parse one after another in one worker thread per cycle, under a timeout (/sys reads can hang
on sick hardware: hwmon over I2C, a PCI device in a bad state). A read that times out is abandoned, not waited for;
while its thread is still stuck, that collector is skipped and reported as failed, so stuck threads never pile up
tick after tick, and the collectors read on the loop are not held up by it. Interpretation runs on the loop once the
reads are in.

A cycle's outcome is a ``TierSnapshot`` (defined in ``nvdaemon.model``, so that what reads one never imports this
module): a frozen value holding the samples, each collector's ``Interpreted`` result of that cycle, each collector's
status of that cycle (a frozen ``CollectorStatus``; the runner makes a new one every cycle rather than updating one)
and the read counts. It holds no collector, so a surface reading it sees that cycle and nothing later.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import outcome
import trio

from nvdaemon.collectors.base import CYCLE_READS, Collector, CycleReads, Gathered, HostRoots, NotPresent
from nvdaemon.model import CollectorStatus, Interpreted, TierSnapshot
from nvdaemon.supervise import describe
from nvdaemon.worker_thread import ReusableThread

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What one gather produced: parsed data, an absent source, or an error (a timeout included)."""

    gathered: Gathered | None = None
    present: bool = True
    error: str = ""
    duration: float = 0.0


class CollectorRunner:
    """One collector of a tier: its gather (in the tier's worker thread), its interpret on the loop, its status."""

    def __init__(self, collector: Collector, limiter: trio.CapacityLimiter) -> None:
        self.collector = collector
        self.limiter = limiter
        self.status = CollectorStatus(collector.name)
        self._in_flight = False  # a gather thread (possibly abandoned after a timeout) is still running

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    def gather_outcome(self, roots: HostRoots) -> Outcome:
        """Read and parse (in a worker thread); never raises an ordinary exception."""
        # Set inside the thread: a call cancelled while still waiting for the limiter never marks itself busy.
        self._in_flight = True
        began = time.perf_counter()
        try:
            outcome = Outcome(self.collector.gather(roots))
        except NotPresent:
            outcome = Outcome(present=False)
        except Exception as exc:
            outcome = Outcome(error=describe(exc))
        finally:
            self._in_flight = False
        outcome.duration = time.perf_counter() - began
        return outcome

    def finish(self, outcome: Outcome, now: float, skipped: str = "") -> Interpreted | None:
        """Interpret a gather's outcome on the loop and record the status (``skipped``: why it did not run).

        The result, or None when nothing was interpreted this cycle (no data, or interpret failed)."""
        prev = self.status
        result: Interpreted | None = None
        errors = [e for e in (skipped, outcome.error) if e]
        duration = outcome.duration
        if outcome.gathered is not None:
            errors.extend(outcome.gathered.errors)
            began = time.perf_counter()
            try:
                result = self.collector.interpret(outcome.gathered, now)
            except Exception as exc:
                errors.append(f"interpret: {describe(exc)}")
            duration += time.perf_counter() - began
        if errors and (not prev.errors or errors[0] != prev.errors[0]):
            # Log a changed error once, not the same line every tick.
            log.warning("collector %s: %s", self.collector.name, "; ".join(errors))
        detail = self.collector.detail()
        if result is not None:
            detail = {**detail, **result.detail()}
        # A new value every cycle: a snapshot that holds the previous one keeps seeing that cycle's status.
        self.status = CollectorStatus(
            self.collector.name,
            success=not errors,
            present=outcome.present,
            duration=duration,
            errors=errors,
            error_total=prev.error_total + len(errors),
            samples=len(result.samples) if result is not None else 0,
            detail=detail,
        )
        return result


STILL_READING = "previous read has not returned yet (hung file system or device); skipped"


class _Batch:
    """One worker thread gathering a tier's collectors that may hang, one after another.

    A thread hop per collector cost more CPU than most collectors' own reads (each hop is a GIL hand-off), so a
    tier's collectors share one thread. A read that hangs still costs only itself: when the batch's deadline
    passes, the collector it is in is reported timed out and stays skipped until its read returns (its
    ``in_flight``), the collectors after it are reported not read this tick, and the abandoned thread stops as soon
    as the hung read returns instead of going on with stale work.
    """

    def __init__(self, runners: Sequence[CollectorRunner], roots: HostRoots) -> None:
        self.runners = runners
        self.roots = roots
        self.lock = threading.Lock()
        self.outcomes: dict[str, Outcome] = {}
        self.current: CollectorRunner | None = None
        self.abandoned = False

    def run(self) -> None:
        for runner in self.runners:
            with self.lock:
                if self.abandoned:
                    return
                self.current = runner
            outcome = runner.gather_outcome(self.roots)
            with self.lock:
                self.outcomes[runner.collector.name] = outcome
                self.current = None

    def stop(self) -> tuple[dict[str, Outcome], CollectorRunner | None]:
        """Abandon the rest; the outcomes so far and the collector still reading (None when all finished)."""
        with self.lock:
            self.abandoned = True
            return dict(self.outcomes), self.current


async def _in_thread(work: Callable[[], None], limiter: trio.CapacityLimiter, worker: ReusableThread) -> None:
    """Run ``work`` in ``worker``'s thread, in a copy of this context, holding ``limiter`` until it has returned.

    ``trio.to_thread.run_sync`` does the same with more per-call machinery (a message channel back into Trio, the
    thread's OS name), which cost about twice the CPU of this round trip, and its thread cache lets a worker go
    after 10 s idle, so a 15 s tick paid a new thread every time (``nvdaemon.worker_thread``). On cancellation the
    thread is abandoned (it keeps running; ``_Batch`` makes it stop early) and ``trio.Cancelled`` propagates; the
    limiter is released only once the thread has really returned.
    """
    borrower = object()
    try:
        limiter.acquire_on_behalf_of_nowait(borrower)
    except trio.WouldBlock:
        await limiter.acquire_on_behalf_of(borrower)
    task = trio.lowlevel.current_task()
    token = trio.lowlevel.current_trio_token()
    waiting = [True]  # False once the wait was cancelled: the result then has no one to go to

    def back(result: outcome.Outcome[None]) -> None:  # on the loop
        limiter.release_on_behalf_of(borrower)
        if waiting[0]:
            trio.lowlevel.reschedule(task, result)

    def deliver(result: outcome.Outcome[None]) -> None:  # in the worker thread, once work returned
        with contextlib.suppress(trio.RunFinishedError):  # the run ended while the thread was stuck
            token.run_sync_soon(back, result)

    def abort(_: Any) -> trio.lowlevel.Abort:
        waiting[0] = False
        return trio.lowlevel.Abort.SUCCEEDED

    held = [contextvars.copy_context()]

    def job() -> None:  # in the worker thread
        context = held.pop()
        result = outcome.capture(context.run, work)
        # Dropped before handing back, not when this thread next runs: the loop, woken by ``deliver``, goes on with
        # the tick while this thread waits for the GIL, and the context holds the cycle's read cache (every text it
        # read, an entry each), which the collection after the tick's pause (nvdaemon.gcpause) then walked: 532
        # entries of the 4,251 objects it met on gpunode.
        del context
        deliver(result)

    worker.run_soon(job)
    await trio.lowlevel.wait_task_rescheduled(abort)


def _present(collector: Collector, roots: HostRoots) -> bool:
    try:
        return collector.present(roots)
    except Exception:  # the gather, in its thread, meets the same error and reports it
        return True


async def collect_tier(
    tier: str,
    runners: Sequence[CollectorRunner],
    roots: HostRoots,
    read_timeout: float,
    worker: ReusableThread | None = None,
) -> TierSnapshot:
    """Run every collector of a tier (on the loop or in one worker thread, see ``_Batch``); a failing one keeps its
    partial samples. ``worker``: the tier loop's thread, kept from tick to tick (a new one when not given)."""
    began = trio.current_time()
    collected_at = time.time()
    await trio.lowlevel.checkpoint_if_cancelled()
    results: dict[str, Interpreted | None] = {}
    inline: dict[str, Outcome] = {}
    threaded: list[CollectorRunner] = []
    absent: dict[str, Outcome] = {}
    for runner in runners:
        if runner.collector.may_hang and not runner.in_flight:
            if _present(runner.collector, roots):
                threaded.append(runner)
            else:  # nothing on this node that could hang: no thread for it
                absent[runner.collector.name] = Outcome(present=False)
    timeout = max((r.collector.read_timeout(read_timeout) for r in threaded), default=read_timeout)
    batch = _Batch(threaded, roots)
    reads = CycleReads()
    token = CYCLE_READS.set(reads)  # the worker thread started below runs in a copy of this context
    try:
        # On the loop first, then the thread: a read on the loop never waits for the worker thread's cache entry.
        for runner in runners:
            if not runner.collector.may_hang:
                inline[runner.collector.name] = runner.gather_outcome(roots)
        if threaded:
            with trio.move_on_after(timeout):
                await _in_thread(batch.run, threaded[0].limiter, worker or ReusableThread(f"tier {tier}"))
    finally:
        CYCLE_READS.reset(token)
        reads.close()  # its errors' tracebacks go: the cache is then freed when the last reference goes
    outcomes, hung = batch.stop()
    outcomes.update(inline)
    outcomes.update(absent)
    for runner in runners:
        name = runner.collector.name
        if name in outcomes:
            results[name] = runner.finish(outcomes[name], collected_at)
        elif runner not in threaded:
            results[name] = runner.finish(Outcome(), collected_at, skipped=STILL_READING)
        elif runner is hung:
            timed_out = Outcome(error=f"read timed out after {timeout:g}s", duration=timeout)
            results[name] = runner.finish(timed_out, collected_at)
        else:
            why = (
                f"not read this tick: collector {hung.collector.name} was still reading"
                if hung is not None
                else f"not read this tick: no worker thread free within {timeout:g}s"
            )
            results[name] = runner.finish(Outcome(), collected_at, skipped=why)
    made = {name: r for name, r in results.items() if r is not None}
    return TierSnapshot(
        tier=tier,
        samples=[s for r in made.values() for s in r.samples],
        collectors={r.collector.name: r.status for r in runners},
        collected_at=collected_at,
        duration=trio.current_time() - began,
        results=made,
        reads=reads.counts(),
    )
