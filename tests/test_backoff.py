"""The one backoff function: a table of each caller's numbers, the same delays as the formulas it replaced (for any
streak, base, cap and draw), and its bounds; then each caller really goes through it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon import supervise
from nvdaemon.backoff import EQUAL, FULL, MAX_EXPONENT, Jitter, backoff, plus_minus
from nvdaemon.config import NvsentinelSink, SpoolConfig, WebhookSink
from nvdaemon.sinks.nvsentinel import reconciler as nvsentinel_reconciler
from nvdaemon.sinks.webhook import endpoint as webhook
from nvdaemon.sinks.webhook import spool_writer


@pytest.mark.parametrize(
    ("failures", "base", "cap", "jitter", "draw", "factor", "expected"),
    [
        # supervised task restarts: 0.5 s doubling to 60 s, equal jitter (a floor of half)
        (0, 0.5, 60.0, EQUAL, 1.0, 2.0, 0.5),
        (1, 0.5, 60.0, EQUAL, 0.0, 2.0, 0.25),
        (3, 0.5, 60.0, EQUAL, 1.0, 2.0, 2.0),
        (3, 0.5, 60.0, EQUAL, 0.5, 2.0, 1.5),
        (8, 0.5, 60.0, EQUAL, 1.0, 2.0, 60.0),  # 64 capped at 60
        (5000, 0.5, 60.0, EQUAL, 0.0, 2.0, 30.0),
        # webhook deliveries: full jitter, anywhere from 0 to the capped delay
        (1, 1.0, 4.0, FULL, 0.5, 2.0, 0.5),
        (3, 1.0, 4.0, FULL, 1.0, 2.0, 4.0),
        (6, 1.0, 4.0, FULL, 0.5, 2.0, 2.0),
        (2, 1.0, 4.0, FULL, 0.0, 2.0, 0.0),
        # NVSentinel sends: 2 s x 1.5^n, +-10 %, no cap
        (1, 2.0, math.inf, plus_minus(0.1), 0.5, 1.5, 2.0),
        (3, 2.0, math.inf, plus_minus(0.1), 0.5, 1.5, 4.5),
        (3, 2.0, math.inf, plus_minus(0.1), 1.0, 1.5, 4.95),
        (3, 2.0, math.inf, plus_minus(0.1), 0.0, 1.5, 4.05),
    ],
)
def test_each_callers_numbers(
    failures: int, base: float, cap: float, jitter: Jitter, draw: float, factor: float, expected: float
) -> None:
    assert backoff(failures, base, cap, jitter, draw, factor) == pytest.approx(expected)


# The formulas the function replaced, as they were in supervise.py, webhook.py, spool_writer.py and the reconciler.
def old_supervisor(failures: int, base: float, cap: float, r: float) -> float:
    delay = min(cap, base * float(2 ** min(max(0, failures - 1), 60)))
    return delay / 2 + delay / 2 * r


def old_webhook(failures: int, base: float, cap: float, r: float) -> float:
    return min(cap, base * float(2 ** min(failures - 1, 60))) * r


def old_storage(failures: int, base: float, cap: float, r: float) -> float:
    ceiling = min(cap, base * float(2 ** min(max(failures - 1, 0), 30)))
    return ceiling / 2 + ceiling / 2 * r


def old_nvsentinel(attempt: int, initial: float, multiplier: float, spread: float, r: float) -> float:
    return initial * multiplier ** (attempt - 1) * (1 + spread * (2 * r - 1))


streaks = st.integers(min_value=1, max_value=200)
bases = st.floats(min_value=0.01, max_value=600)
caps = st.floats(min_value=0.01, max_value=600)
draws = st.floats(min_value=0, max_value=1)


@given(streaks, bases, caps, draws)
def test_same_delays_as_the_replaced_formulas(failures: int, base: float, cap: float, r: float) -> None:
    same = pytest.approx
    assert backoff(failures, base, cap, EQUAL, r) == same(old_supervisor(failures, base, cap, r), rel=1e-12)
    assert backoff(failures, base, cap, FULL, r) == same(old_webhook(failures, base, cap, r), rel=1e-12, abs=1e-12)
    small_cap = min(cap, 30.0)
    assert backoff(failures, base, small_cap, EQUAL, r) == same(old_storage(failures, base, small_cap, r), rel=1e-12)


@given(
    st.integers(min_value=1, max_value=10),  # maxAttempts is at most 10
    st.floats(min_value=0.01, max_value=600),
    st.floats(min_value=1, max_value=10),
    st.floats(min_value=0, max_value=1),
    draws,
)
def test_same_delays_as_the_nvsentinel_formula(
    attempt: int, initial: float, mult: float, spread: float, r: float
) -> None:
    got = backoff(attempt, initial, math.inf, plus_minus(spread), r, mult)
    assert got == pytest.approx(old_nvsentinel(attempt, initial, mult, spread, r), rel=1e-12)


@given(st.integers(min_value=0, max_value=10**6), bases, caps, draws, st.sampled_from([EQUAL, FULL]))
def test_bounds_and_growth(failures: int, base: float, cap: float, r: float, jitter: Jitter) -> None:
    delay = backoff(failures, base, cap, jitter, r)
    assert 0 <= delay <= cap
    assert delay >= min(cap, base) * (jitter.centre - jitter.spread)  # EQUAL: never under half the first delay
    assert backoff(failures + 1, base, cap, jitter, r) >= delay  # a longer streak never waits less
    assert backoff(failures, base, cap, jitter, 1.0) >= delay >= backoff(failures, base, cap, jitter, 0.0)


def test_a_streak_of_days_does_not_overflow() -> None:
    assert backoff(10**9, 2.0, math.inf, plus_minus(0.1), 0.5, 10.0) == 2.0 * 10.0**MAX_EXPONENT


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[object, ...]]:
    """Every caller's module sees a ``backoff`` that records its arguments and answers the real delay."""
    calls: list[tuple[object, ...]] = []

    def recording(*args: object) -> float:
        calls.append(args)
        return backoff(*args)  # type: ignore[arg-type]

    for module in (supervise, webhook, spool_writer, nvsentinel_reconciler):
        monkeypatch.setattr(module, "backoff", recording)
    return calls


async def test_every_caller_goes_through_it_with_its_numbers(tmp_path: Path, spy: list[tuple[object, ...]]) -> None:
    async with trio.open_nursery() as nursery:
        sup = supervise.Supervisor(nursery, jitter=lambda: 0.25)
    assert sup.backoff(4) == 0.5 * 8 * 0.625
    hook = WebhookSink(url="http://127.0.0.1:9/", backoff_base_seconds=0.3, backoff_max_seconds=7.0)
    endpoint = webhook.WebhookEndpoint("webhook:x", hook, SpoolConfig(), tmp_path, jitter=lambda: 0.25)
    assert endpoint._backoff(6) == 7.0 * 0.25  # 0.3 x 32 capped at 7, full jitter
    endpoint.health.failures = 9
    assert endpoint.health.delay() == 7.0 * 0.625  # the endpoint's numbers, equal jitter
    settings = NvsentinelSink(retry_initial_seconds=0.2, retry_multiplier=3.0, retry_jitter=0.4)
    rec = nvsentinel_reconciler.Reconciler(
        settings, node="n", state_path=tmp_path / "s.json", boot_id_path=None, jitter=lambda: 0.25
    )
    assert rec._delay(3) == pytest.approx(0.2 * 9 * 0.8)  # +-40 %, the draw 0.25 gives -20 %
    assert spy == [
        (4, 0.5, 60.0, EQUAL, 0.25),
        (6, 0.3, 7.0, FULL, 0.25),
        (9, 0.3, 7.0, EQUAL, 0.25),
        (3, 0.2, math.inf, plus_minus(0.4), 0.25, 3.0),
    ]
