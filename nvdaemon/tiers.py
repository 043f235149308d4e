"""Tier loops: run a tier's collectors every interval, publish the snapshot, feed the engine.

Each collector's read+parse runs in a worker thread under a timeout (/sys reads can hang on sick hardware: hwmon
over I2C, a PCI device in a bad state). A read that times out is abandoned, not waited for; while its thread is
still stuck, that collector is skipped and reported as failed, so stuck threads never pile up tick after tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
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


class CollectorRunner:
    """Runs one collector: gather in a thread with a timeout, interpret on the loop, keep its status."""

    def __init__(self, collector: Collector, limiter: trio.CapacityLimiter) -> None:
        self.collector = collector
        self.limiter = limiter
        self.status = CollectorStatus(collector.name)
        self._in_flight = False  # a gather thread (possibly abandoned after a timeout) is still running

    def _gather(self, roots: HostRoots) -> Gathered:
        # Set inside the thread: a call cancelled while still waiting for the limiter never marks itself busy.
        self._in_flight = True
        try:
            return self.collector.gather(roots)
        finally:
            self._in_flight = False

    async def run(self, roots: HostRoots, read_timeout: float, now: Callable[[], float]) -> list[Sample]:
        st = self.status
        began = trio.current_time()
        samples: list[Sample] = []
        errors: list[str] = []
        present = True
        if self._in_flight:
            errors.append("previous read has not returned yet (hung file system or device); skipped")
        else:
            gathered: Gathered | None = None
            read_timeout = self.collector.read_timeout(read_timeout)  # the smart tier allows its smartctl runs
            try:
                with trio.move_on_after(read_timeout) as scope:
                    gathered = await trio.to_thread.run_sync(
                        self._gather, roots, limiter=self.limiter, abandon_on_cancel=True
                    )
                if scope.cancelled_caught:
                    errors.append(f"read timed out after {read_timeout:g}s")
            except NotPresent:
                present = False
            except Exception as exc:
                errors.append(describe(exc))
            if gathered is not None:
                errors.extend(gathered.errors)
                try:
                    samples = self.collector.interpret(gathered, now())
                except Exception as exc:
                    errors.append(f"interpret: {describe(exc)}")
        if errors and (not st.errors or errors[0] != st.errors[0]):
            # Log a changed error once, not the same line every tick.
            log.warning("collector %s: %s", self.collector.name, "; ".join(errors))
        st.success, st.present, st.errors = not errors, present, errors
        st.error_total += len(errors)
        st.duration = trio.current_time() - began
        st.samples = len(samples)
        st.detail = self.collector.detail()
        return samples


async def collect_tier(
    tier: str, runners: Sequence[CollectorRunner], roots: HostRoots, read_timeout: float
) -> TierSnapshot:
    """Run every collector of a tier concurrently; partial samples of a failing collector are kept."""
    began = trio.current_time()
    collected_at = time.time()
    results: dict[str, list[Sample]] = {}

    async def one(runner: CollectorRunner) -> None:
        results[runner.collector.name] = await runner.run(roots, read_timeout, lambda: collected_at)

    reads = CycleReads()
    token = CYCLE_READS.set(reads)  # the worker threads started below run in copies of this context
    try:
        async with trio.open_nursery() as nursery:
            for runner in runners:
                nursery.start_soon(one, runner)
    finally:
        CYCLE_READS.reset(token)
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
