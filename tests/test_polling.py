"""tests/polling.py, the suite's one way to wait: the result comes back, a timeout names what was awaited."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing

from tests.polling import until, until_sync


async def test_until_returns_the_first_true_result(autojump_clock: trio.testing.MockClock) -> None:
    calls = itertools.count()
    assert await until(lambda: next(calls) >= 3 and "third", timeout=5) == "third"


async def test_until_awaits_an_async_predicate(autojump_clock: trio.testing.MockClock) -> None:
    answers: list[dict[str, int]] = [{}, {}, {"up": 1}]

    async def probe() -> dict[str, int]:
        await trio.sleep(0.1)
        return answers.pop(0)

    assert await until(probe, timeout=5) == {"up": 1}


async def test_until_names_what_it_waited_for(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[int] = []
    with pytest.raises(AssertionError, match=r"timed out after 2s waiting for 3 events; got \[1\]"):
        await until(lambda: seen.append(1), lambda: f"3 events; got {seen[:1]}", timeout=2)
    assert seen  # it asked


def test_until_sync_returns_and_times_out() -> None:
    calls = itertools.count()
    assert until_sync(lambda: next(calls) == 2, timeout=30, step=0.001) is True
    with pytest.raises(AssertionError, match=r"timed out after 0\.01s waiting for the condition"):
        until_sync(lambda: False, timeout=0.01, step=0.001)
