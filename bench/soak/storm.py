"""The soak's reload storm: ``STORM_SIGHUPS`` SIGHUPs in ``STORM_SECONDS``, alternating two configs that differ only in
the webhook endpoint's ``timeoutSeconds``, so every reload the agent applies replaces the endpoint (its fingerprint
changes) while events keep coming (a correctable burst, 2 x ``host.CLONES`` events, at the start and half-way).

A replaced endpoint hands what it holds and its counters to its successor, so the soak's accounting (emitted =
delivered + counted drops) must hold through the storm. The storm's own check: every SIGHUP sent, the agent applied
reloads (SIGHUPs that come during a reload make one more reload, not one each) and rejected none, ``/healthz``
answered 200 each time it was asked during the storm, and ``nodevitals_delivery_dropped_total`` never went down.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from bench.common import rss_kib
from bench.soak.verdict import Check

if TYPE_CHECKING:
    import httpx

    from bench.soak.verdict import Run


class Soak(Protocol):
    """What the storm uses of the soak (``bench.soak.runner.Soak``): its lock, the agent's current run, its HTTP
    port, the webhook timeout it writes into the config, and the event burst."""

    lock: trio.Lock
    webhook_timeout: float

    @property
    def run(self) -> Run: ...

    async def get(self, path: str) -> httpx.Response | None: ...

    async def status(self) -> dict[str, Any] | None: ...

    def burst(self) -> None: ...

    def write_config(self) -> None: ...


STORM_SIGHUPS = 200
STORM_SECONDS = 10.0
STORM_AT = 0.8  # of the run: after the SIGKILL restart, so the last run's drop counters cover the storm
SETTLE_POLLS = 3  # the reload count unchanged this many polls in a row: the agent has answered the storm
SETTLE_POLL_SECONDS = 0.3
SETTLE_MAX_SECONDS = 30.0
DROPPED = "nodevitals_delivery_dropped_total{"


@dataclass
class Storm:
    """What the storm did and saw."""

    sighups: int = 0
    applied: int = 0  # reloads the agent counted during the storm (ok)
    rejected: int = 0
    seconds: float = 0.0
    settled: bool = False  # the agent's reload count stopped moving after the last SIGHUP
    health_asked: int = 0
    health_failures: list[str] = field(default_factory=list)  # /healthz answers other than 200
    drops: list[float] = field(default_factory=list)  # nodevitals_delivery_dropped_total, summed over sinks
    rss_kib: tuple[int, int] | None = None  # the agent's RSS just before and after the storm


async def reload_count(soak: Soak) -> tuple[int, int] | None:
    st = await soak.status()
    return None if st is None else (st["reloads"]["ok"], st["reloads"]["rejected"])


async def dropped_total(soak: Soak) -> float | None:
    r = await soak.get("/metrics")
    if r is None or r.status_code != 200:
        return None
    return sum(float(line.rpartition(" ")[2]) for line in r.text.splitlines() if line.startswith(DROPPED))


async def reload_storm(soak: Soak, storm: Storm, at: float) -> None:
    """At ``at`` (trio clock), under the soak's lock (no other SIGHUP, no kill meanwhile), send the storm, then wait
    until the agent has answered it; the reloads it applied are added to the run's expected count."""
    await trio.sleep_until(at)
    async with soak.lock:
        run = soak.run
        rss_before = rss_kib(run.proc.pid)
        before = await reload_count(soak)
        if (first := await dropped_total(soak)) is not None:
            storm.drops.append(first)
        began = trio.current_time()
        timeouts = (soak.webhook_timeout, soak.webhook_timeout + 1)
        try:
            for i in range(STORM_SIGHUPS):
                if i in (0, STORM_SIGHUPS // 2):
                    soak.burst()
                soak.webhook_timeout = timeouts[(i + 1) % 2]
                soak.write_config()
                run.proc.send_signal(signal.SIGHUP)
                storm.sighups += 1
                health = await soak.get("/healthz")
                storm.health_asked += 1
                if health is None or health.status_code != 200:
                    storm.health_failures.append("no answer" if health is None else health.text[:200])
                if i % 10 == 9 and (n := await dropped_total(soak)) is not None:
                    storm.drops.append(n)
                await trio.sleep_until(began + STORM_SECONDS * (i + 1) / STORM_SIGHUPS)
        finally:
            soak.webhook_timeout = timeouts[0]  # the config on disk is timeouts[0] too: an even count of flips
        storm.seconds = trio.current_time() - began
        last, same = before, 0
        with trio.move_on_after(SETTLE_MAX_SECONDS):
            while same < SETTLE_POLLS:
                await trio.sleep(SETTLE_POLL_SECONDS)
                now = await reload_count(soak)
                same = same + 1 if now == last and now is not None else 0
                last = now
            storm.settled = True
        if before is not None and last is not None:
            storm.applied, storm.rejected = last[0] - before[0], last[1] - before[1]
            run.storm_reloads += storm.applied + storm.rejected
        if (n := await dropped_total(soak)) is not None:
            storm.drops.append(n)
        storm.rss_kib = (rss_before, rss_kib(run.proc.pid))
        run.storm_end = time.monotonic() - run.started


def check_storm(storm: Storm) -> Check:
    """11. The reload storm: sent, answered, none rejected, /healthz 200 throughout, the drop counter never down."""
    ok = (
        storm.sighups == STORM_SIGHUPS
        and storm.settled
        and storm.applied > 0
        and storm.rejected == 0
        and not storm.health_failures
        and storm.drops == sorted(storm.drops)
        and len(storm.drops) >= 2
    )
    drops = f"{storm.drops[0]:g} -> {storm.drops[-1]:g}" if storm.drops else "never read"
    return Check(
        "reload storm",
        ok,
        f"{storm.sighups} SIGHUPs in {storm.seconds:.1f} s, {storm.applied} reloads applied (each replacing the "
        f"webhook endpoint), {storm.rejected} rejected{'' if storm.settled else ', still reloading at the end'}; "
        f"/healthz not 200 {len(storm.health_failures)} of {storm.health_asked} times"
        + (f" (first: {storm.health_failures[0]!r})" if storm.health_failures else "")
        + f"; nodevitals_delivery_dropped_total {drops}"
        + ("" if storm.drops == sorted(storm.drops) else f", went down: {storm.drops}")
        + (f"; RSS {storm.rss_kib[0] / 1024:.1f} -> {storm.rss_kib[1] / 1024:.1f} MiB" if storm.rss_kib else ""),
    )
