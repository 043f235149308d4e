"""Tier loops: run a tier's collectors every interval, publish the snapshot, feed the engine.

A tier's collectors read+parse one after another in one worker thread per cycle, under a timeout (/sys reads can
hang on sick hardware: hwmon over I2C, a PCI device in a bad state). A read that times out is abandoned, not waited
for; while its thread is still stuck, that collector is skipped and reported as failed, so stuck threads never pile
up tick after tick. Interpretation runs on the loop once the reads are in.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from nvdaemon.collectors.base import CYCLE_READS, Collector, CycleReads, Gathered, HostRoots, NotPresent
from nvdaemon.model import Sample
from nvdaemon.supervise import describe

log = logging.getLogger(__name__)


@dataclass
class CollectorStatus:
    """The outcome of a collector's latest run, and its totals since start."""

    name: str
    success: bool = False  # no error this run (an absent source is not an error)
    present: bool = True  # the source exists on this node
    duration: float = 0.0
    errors: list[str] = field(default_factory=list)
    error_total: int = 0
    samples: int = 0
    detail: dict[str, Any] = field(default_factory=dict)  # Collector.detail() of the last run, when it has one

    def as_json(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "present": self.present,
            "durationSeconds": round(self.duration, 6),
            "errors": self.errors,
            "errorTotal": self.error_total,
            "samples": self.samples,
            **({"detail": self.detail} if self.detail else {}),
        }


@dataclass
class TierSnapshot:
    tier: str
    samples: list[Sample]
    collectors: dict[str, CollectorStatus]
    collected_at: float
    duration: float
    # The collector instances, for surfaces that need more than samples (the smartctl_exporter drop-in).
    sources: dict[str, Collector] = field(default_factory=dict)
    reads: CycleReads | None = None  # the cycle's shared file reads (how many were shared between collectors)


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

    def finish(self, outcome: Outcome, now: float, skipped: str = "") -> list[Sample]:
        """Interpret a gather's outcome on the loop and record the status (``skipped``: why it did not run)."""
        st = self.status
        samples: list[Sample] = []
        errors = [e for e in (skipped, outcome.error) if e]
        if outcome.gathered is not None:
            errors.extend(outcome.gathered.errors)
            began = time.perf_counter()
            try:
                samples = self.collector.interpret(outcome.gathered, now)
            except Exception as exc:
                errors.append(f"interpret: {describe(exc)}")
            outcome.duration += time.perf_counter() - began
        if errors and (not st.errors or errors[0] != st.errors[0]):
            # Log a changed error once, not the same line every tick.
            log.warning("collector %s: %s", self.collector.name, "; ".join(errors))
        st.success, st.present, st.errors = not errors, outcome.present, errors
        st.error_total += len(errors)
        st.duration = outcome.duration
        st.samples = len(samples)
        st.detail = self.collector.detail()
        return samples


STILL_READING = "previous read has not returned yet (hung file system or device); skipped"


class _Batch:
    """One worker thread gathering a tier's collectors one after another.

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


async def collect_tier(
    tier: str, runners: Sequence[CollectorRunner], roots: HostRoots, read_timeout: float
) -> TierSnapshot:
    """Run every collector of a tier (one worker thread, see ``_Batch``); a failing one keeps its partial samples."""
    began = trio.current_time()
    collected_at = time.time()
    results: dict[str, list[Sample]] = {}
    due = [r for r in runners if not r.in_flight]
    timeout = max((r.collector.read_timeout(read_timeout) for r in due), default=read_timeout)
    batch = _Batch(due, roots)
    reads = CycleReads()
    token = CYCLE_READS.set(reads)  # the worker thread started below runs in a copy of this context
    try:
        if due:
            with trio.move_on_after(timeout):
                await trio.to_thread.run_sync(batch.run, limiter=due[0].limiter, abandon_on_cancel=True)
    finally:
        CYCLE_READS.reset(token)
    outcomes, hung = batch.stop()
    for runner in runners:
        name = runner.collector.name
        if runner not in due:
            results[name] = runner.finish(Outcome(), collected_at, skipped=STILL_READING)
        elif name in outcomes:
            results[name] = runner.finish(outcomes[name], collected_at)
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
    samples = [s for runner in runners for s in results.get(runner.collector.name, [])]
    return TierSnapshot(
        tier=tier,
        samples=samples,
        collectors={r.collector.name: r.status for r in runners},
        collected_at=collected_at,
        duration=trio.current_time() - began,
        sources={r.collector.name: r.collector for r in runners},
        reads=reads,
    )
