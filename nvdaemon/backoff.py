"""Capped exponential backoff with jitter: the one formula behind every retry delay of the agent.

Callers and their numbers (seconds):

- supervised task restarts (``supervise.Supervisor``): base 0.5, cap 60, factor 2, equal jitter;
- webhook deliveries (``sinks.webhook``): ``backoffBaseSeconds``, ``backoffMaxSeconds``, factor 2, full jitter;
- refused spool writes (``sinks.webhook.spool_writer.StorageHealth``): the endpoint's base, its cap but at most 30,
  factor 2, equal jitter;
- NVSentinel sends (``sinks.nvsentinel.reconciler``): ``retryInitialSeconds``, no cap within a pass (``maxAttempts``
  bounds the retries), factor ``retryMultiplier``, ``retryJitter`` either side; across ticks a held send waits the
  same formula carried on, at most 60 s (``sinks.nvsentinel.hold``).

Pure: the random draw is the caller's (each has an injectable ``jitter`` source, so tests pin it).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_EXPONENT = 60  # a failure streak of days cannot overflow the float conversion; every cap is reached long before


@dataclass(frozen=True)
class Jitter:
    """The delay is multiplied by a factor spread evenly over ``[centre - spread, centre + spread]``."""

    centre: float
    spread: float


FULL = Jitter(0.5, 0.5)  # anywhere in [0, delay]: retries of many clients spread out the most
EQUAL = Jitter(0.75, 0.25)  # in [delay/2, delay]: a floor, so a failure is never retried in a hot loop


def plus_minus(fraction: float) -> Jitter:
    """``delay`` +- ``fraction`` of it (0.1: 90 % to 110 %)."""
    return Jitter(1.0, fraction)


def backoff(failures: int, base: float, cap: float, jitter: Jitter, draw: float, factor: float = 2.0) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (0 counts as 1): ``base * factor**(failures-1)``,
    at most ``cap`` (``math.inf``: none), times the jitter factor that ``draw`` (uniform in [0, 1]) picks."""
    exponent = min(max(failures - 1, 0), MAX_EXPONENT)
    delay = min(cap, base * float(factor) ** exponent)
    return delay * (jitter.centre + jitter.spread * (2 * draw - 1))


__all__ = ["EQUAL", "FULL", "MAX_EXPONENT", "Jitter", "backoff", "plus_minus"]
