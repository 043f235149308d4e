"""The supervisor: restart with capped backoff, isolation between tasks, start/stop, cancellation never swallowed,
stuck detection and the stable-run reset. Time is trio's autojump mock clock, so backoffs cost nothing."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.testing

from nvdaemon.supervise import ServeFn, Supervisor, TaskState, describe


class Attempts:
    """Records the (mock) time of every attempt of a supervised function."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def gaps(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.times)]


async def crash_at_once(attempts: Attempts, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Fails before it is ready, like a server that cannot bind."""
    attempts.times.append(trio.current_time())
    raise ValueError("cannot bind")


async def crash_later(
    attempts: Attempts, run_for: list[float], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Ready at once, then fails after the next duration of ``run_for`` (the last one repeats)."""
    attempts.times.append(trio.current_time())
    task_status.started()
    duration = run_for.pop(0) if len(run_for) > 1 else run_for[0]
    await trio.sleep(duration)
    raise RuntimeError("sensor vanished")


async def ticker(ticks: list[float], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    while True:
        ticks.append(trio.current_time())
        await trio.sleep(1)


async def serve_forever(
    attempts: Attempts, cleaned: list[float], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    attempts.times.append(trio.current_time())
    task_status.started()
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            await trio.sleep(2)  # a slow, orderly cleanup
        cleaned.append(trio.current_time())


async def finish(attempts: Attempts, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    attempts.times.append(trio.current_time())
    task_status.started()
    await trio.sleep(1)


async def start_promptly(sup: Supervisor, name: str, fn: ServeFn, *args: Any, critical: bool = False) -> None:
    """``sup.start`` of a task whose first attempt fails: it must return at once, not wait out a backoff (and a
    regression must fail the test rather than hang it)."""
    with trio.fail_after(0.5):
        await sup.start(name, fn, *args, critical=critical)


# --- backoff ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failures", "full", "floor"),
    [
        (0, 0.5, 0.25),
        (1, 0.5, 0.25),
        (2, 1.0, 0.5),
        (3, 2.0, 1.0),
        (7, 32.0, 16.0),
        (8, 60.0, 30.0),  # 64 capped at 60
        (9, 60.0, 30.0),
        (100, 60.0, 30.0),
    ],
)
async def test_backoff_grows_and_is_capped(failures: int, full: float, floor: float) -> None:
    async with trio.open_nursery() as nursery:
        high = Supervisor(nursery, backoff_base=0.5, backoff_max=60.0, jitter=lambda: 1.0)
        low = Supervisor(nursery, backoff_base=0.5, backoff_max=60.0, jitter=lambda: 0.0)
        half = Supervisor(nursery, backoff_base=0.5, backoff_max=60.0, jitter=lambda: 0.5)
        assert high.backoff(failures) == full
        assert low.backoff(failures) == floor
        assert half.backoff(failures) == (full + floor) / 2


async def test_backoff_is_capped_for_very_long_failure_streaks() -> None:
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=0.5, backoff_max=60.0, jitter=lambda: 1.0)
    assert sup.backoff(1024) == 60.0
    assert sup.backoff(1025) == 60.0
    assert sup.backoff(5000) == 60.0


# --- restart ------------------------------------------------------------------------------------------------------


async def test_crashing_task_is_restarted_with_backoff_while_others_keep_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    crashes, ticks = Attempts(), list[float]()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, backoff_max=8.0, jitter=lambda: 1.0)
        t0 = trio.current_time()
        await sup.start("counter", ticker, ticks)
        await start_promptly(sup, "broken", crash_at_once, crashes)
        broken, counter = sup.tasks["broken"], sup.tasks["counter"]
        assert (broken.state, broken.restarts, broken.consecutive_failures) == ("backoff", 0, 1)
        assert broken.last_error == "ValueError: cannot bind"
        assert broken.last_error_at is not None
        await trio.sleep(24.5)
        # delays 1, 2, 4, 8, then capped at 8
        assert [round(g, 6) for g in crashes.gaps()] == [1.0, 2.0, 4.0, 8.0, 8.0]
        assert crashes.times[0] == t0
        assert broken.restarts == 5
        assert broken.consecutive_failures == 6
        assert broken.state == "backoff"
        assert broken.as_json()["restarts"] == 5
        assert broken.as_json()["lastError"] == "ValueError: cannot bind"
        # the neighbour never noticed
        assert (counter.state, counter.restarts, counter.last_error) == ("running", 0, None)
        assert len(ticks) == 25
        assert [round(g, 6) for g in (b - a for a, b in itertools.pairwise(ticks))] == [1.0] * 24
        nursery.cancel_scope.cancel()


async def test_backoff_with_zero_jitter_is_the_floor(autojump_clock: trio.testing.MockClock) -> None:
    crashes = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, backoff_max=8.0, jitter=lambda: 0.0)
        await start_promptly(sup, "broken", crash_at_once, crashes)
        await trio.sleep(12)
        assert [round(g, 6) for g in crashes.gaps()] == [0.5, 1.0, 2.0, 4.0, 4.0]
        nursery.cancel_scope.cancel()


async def test_failure_after_start_is_restarted_and_described(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, jitter=lambda: 1.0)
        await sup.start("x", crash_later, attempts, [3.0])
        st = sup.tasks["x"]
        assert st.state == "running"
        assert st.started_at is not None
        await trio.sleep(3.5)  # failed at 3, restarts at 4
        assert (st.state, st.restarts, st.consecutive_failures) == ("backoff", 0, 1)
        assert st.last_error == "RuntimeError: sensor vanished"  # unwrapped from the nursery's exception group
        await trio.sleep(1)
        assert (st.state, st.restarts) == ("running", 1)
        assert len(attempts.times) == 2
        nursery.cancel_scope.cancel()


async def test_start_returns_after_a_failed_first_attempt_and_keeps_retrying(
    autojump_clock: trio.testing.MockClock,
) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, jitter=lambda: 1.0)
        t0 = trio.current_time()
        with trio.fail_after(0.5):
            await sup.start("broken", crash_at_once, attempts)
        assert trio.current_time() == t0  # returned at once, not after a backoff
        assert len(attempts.times) == 1
        assert sup.tasks["broken"].state == "backoff"
        await trio.sleep(10)
        assert len(attempts.times) == 4  # 0, 1, 3, 7
        nursery.cancel_scope.cancel()


async def test_start_waits_until_the_task_is_ready(autojump_clock: trio.testing.MockClock) -> None:
    async def slow_ready(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.sleep(5)
        task_status.started()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery)
        t0 = trio.current_time()
        await sup.start("slow", slow_ready)
        assert trio.current_time() - t0 == pytest.approx(5.0)
        assert sup.tasks["slow"].state == "running"
        nursery.cancel_scope.cancel()


async def test_task_returning_normally_is_not_restarted(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0)
        await sup.start("once", finish, attempts)
        st = sup.tasks["once"]
        await trio.sleep(100)
        assert len(attempts.times) == 1
        assert (st.state, st.restarts, st.consecutive_failures, st.last_error) == ("stopped", 0, 0, None)
        assert st.done.is_set()
    # the supervisor's nursery finished on its own: nothing was left running


# --- stop ---------------------------------------------------------------------------------------------------------


async def test_stop_cancels_and_waits_for_cleanup(autojump_clock: trio.testing.MockClock) -> None:
    attempts, cleaned, ticks = Attempts(), list[float](), list[float]()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery)
        await sup.start("server", serve_forever, attempts, cleaned)
        await sup.start("counter", ticker, ticks)
        st = sup.tasks["server"]
        await trio.sleep(3)
        t = trio.current_time()
        await sup.stop("server")
        assert cleaned == [pytest.approx(t + 2.0)]  # stop returned only after the cleanup finished
        assert st.state == "stopped"
        assert st.done.is_set()
        assert "server" not in sup.tasks
        assert len(attempts.times) == 1  # stopping is not a failure: no restart
        assert (st.consecutive_failures, st.last_error, st.restarts) == (0, None, 0)
        n = len(ticks)
        await trio.sleep(3)
        assert len(ticks) > n  # the other task is unaffected
        assert not nursery.cancel_scope.cancel_called
        await sup.stop("no-such-task")  # harmless
        nursery.cancel_scope.cancel()


async def test_stop_during_backoff(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=100.0, jitter=lambda: 1.0)
        await start_promptly(sup, "broken", crash_at_once, attempts)
        st = sup.tasks["broken"]
        t = trio.current_time()
        await sup.stop("broken")
        assert trio.current_time() == t
        assert st.state == "stopped"
        await trio.sleep(1000)
        assert len(attempts.times) == 1


async def test_start_under_the_same_name_replaces(autojump_clock: trio.testing.MockClock) -> None:
    first, second, cleaned = Attempts(), Attempts(), list[float]()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery)
        await sup.start("server", serve_forever, first, cleaned)
        old = sup.tasks["server"]
        await sup.start("server", serve_forever, second, cleaned, fingerprint=("v", 2))
        assert old.state == "stopped"
        assert len(cleaned) == 1
        new = sup.tasks["server"]
        assert new is not old
        assert (new.state, new.fingerprint) == ("running", ("v", 2))
        assert len(second.times) == 1
        nursery.cancel_scope.cancel()


# --- cancellation is never swallowed ------------------------------------------------------------------------------


async def test_cancel_during_backoff_sleep_ends_promptly(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    st: TaskState | None = None
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery, backoff_base=100.0, jitter=lambda: 1.0)
            await start_promptly(sup, "broken", crash_at_once, attempts)
            st = sup.tasks["broken"]
            await trio.sleep(5)
            assert st.state == "backoff"
            cancelled_at = trio.current_time()
            outer.cancel()
            await trio.sleep(0)
        pytest.fail("unreachable: the enclosing scope was cancelled")  # pragma: no cover
    assert outer.cancelled_caught
    assert trio.current_time() == cancelled_at  # did not sit out the 100 s backoff
    assert st is not None
    assert st.state == "stopped"
    assert st.done.is_set()
    assert len(attempts.times) == 1


async def test_cancel_while_running_ends_promptly(autojump_clock: trio.testing.MockClock) -> None:
    attempts, cleaned = Attempts(), list[float]()
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery)
            await sup.start("server", serve_forever, attempts, cleaned)
            st = sup.tasks["server"]
            await trio.sleep(5)
            cancelled_at = trio.current_time()
            outer.cancel()
            await trio.sleep(0)
    assert outer.cancelled_caught
    assert trio.current_time() == pytest.approx(cancelled_at + 2.0)  # only the shielded cleanup
    assert cleaned == [pytest.approx(cancelled_at + 2.0)]
    assert st.state == "stopped"
    assert len(attempts.times) == 1
    assert (st.consecutive_failures, st.last_error) == (0, None)  # the cancellation was not taken for a failure


async def test_cancel_while_starting_ends_promptly(autojump_clock: trio.testing.MockClock) -> None:
    async def never_ready(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.sleep_forever()

    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            sup = Supervisor(nursery)
            nursery.start_soon(sup.start, "hung", never_ready)
            await trio.sleep(5)
            st = sup.tasks["hung"]
            assert st.state == "starting"
            outer.cancel()
            await trio.sleep(0)
    assert outer.cancelled_caught
    assert st.state == "stopped"
    assert (st.restarts, st.consecutive_failures) == (0, 0)


# --- stuck and stable -----------------------------------------------------------------------------------------


async def test_stuck_lists_critical_tasks_after_stuck_after_failures(autojump_clock: trio.testing.MockClock) -> None:
    a, b, c = Attempts(), Attempts(), list[float]()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, jitter=lambda: 1.0, stuck_after=3)
        await start_promptly(sup, "crit", crash_at_once, a, critical=True)
        await start_promptly(sup, "optional", crash_at_once, b)
        await sup.start("healthy", ticker, c, critical=True)
        assert sup.stuck() == []
        await trio.sleep(1.5)  # failures at 0 and 1
        assert sup.tasks["crit"].consecutive_failures == 2
        assert sup.stuck() == []
        await trio.sleep(2)  # third failure at 3
        assert sup.tasks["crit"].consecutive_failures == 3
        assert sup.tasks["optional"].consecutive_failures == 3
        assert sup.stuck() == ["crit"]
        assert sup.tasks["crit"].as_json()["critical"] is True
        nursery.cancel_scope.cancel()


async def test_a_stable_run_resets_the_failure_streak(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, jitter=lambda: 1.0, stable_after=10.0, stuck_after=3)
        # runs of 1 s, 1 s, 1 s (three quick failures), then 20 s (stable) before failing again, then 1 s, …
        await sup.start("x", crash_later, attempts, [1.0, 1.0, 1.0, 20.0, 1.0], critical=True)
        st = sup.tasks["x"]
        await trio.sleep(1.5)
        assert st.consecutive_failures == 1
        await trio.sleep(6)  # failures at 1, 3 and 6 (restarts at 2, 5 and 10)
        assert st.consecutive_failures == 3
        assert sup.stuck() == ["x"]
        # fourth attempt starts at 10 and runs 20 s: its failure at 30 starts a new streak
        await trio.sleep(30.5 - trio.current_time() + attempts.times[0])
        assert len(attempts.times) == 4
        assert st.consecutive_failures == 1
        assert st.restarts == 3
        assert sup.stuck() == []
        nursery.cancel_scope.cancel()


async def test_recovered_critical_task_is_not_stuck_after_a_stable_run(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, jitter=lambda: 1.0, stable_after=10.0, stuck_after=3)
        t0 = trio.current_time()
        # failures at 1, 3 and 6; the fourth attempt starts at 10 and then keeps running
        await sup.start("x", crash_later, attempts, [1.0, 1.0, 1.0, 1e9], critical=True)
        st = sup.tasks["x"]
        await trio.sleep(12 - (trio.current_time() - t0))
        assert (st.state, len(attempts.times), st.consecutive_failures) == ("running", 4, 3)
        assert sup.stuck() == ["x"]  # running again, but not yet for stable_after
        await trio.sleep(21 - (trio.current_time() - t0))
        assert st.state == "running"
        assert sup.stuck() == []  # recovered: /healthz must not keep failing it
        nursery.cancel_scope.cancel()


async def test_a_crash_loop_of_thousands_of_failures_keeps_retrying(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=0.5, backoff_max=60.0, jitter=lambda: 1.0)
        await start_promptly(sup, "broken", crash_at_once, attempts)
        await trio.sleep(60.0 * 1100)
        st = sup.tasks["broken"]
        assert st.consecutive_failures > 1025
        assert st.state == "backoff"
        assert round(attempts.gaps()[-1], 6) == 60.0
        nursery.cancel_scope.cancel()


async def test_failure_while_stopping_is_not_restarted(autojump_clock: trio.testing.MockClock) -> None:
    attempts = Attempts()
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, backoff_base=1.0, jitter=lambda: 1.0)
        await sup.start("x", crash_later, attempts, [2.0])
        sup.stopping = True  # the agent is shutting down
        await trio.sleep(50)
        st = sup.tasks["x"]
        assert (st.state, st.restarts, len(attempts.times)) == ("stopped", 0, 1)
        assert st.last_error == "RuntimeError: sensor vanished"
        assert st.done.is_set()


def test_describe() -> None:
    assert describe(ValueError("bad")) == "ValueError: bad"
    assert describe(KeyError()) == "KeyError"
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [OSError("disk gone")]), ValueError("x")])
    assert describe(nested) == "OSError: disk gone"


async def test_start_returns_what_the_first_attempt_reported_and_keeps_the_latest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """``start`` hands back the first attempt's ``task_status.started`` value (a server's binds), or None when that
    attempt failed; ``started_value`` follows every later attempt that started."""
    attempts = 0

    async def reports(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("address in use")
        task_status.started(f"attempt {attempts}")
        await trio.sleep_forever()

    async def ready(*, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started("bound")
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, jitter=lambda: 0.0)
        assert await sup.start("ready", ready) == "bound"
        assert await sup.start("flaky", reports) is None
        assert sup.tasks["flaky"].started_value is None
        await trio.sleep(5)  # past the first backoff: the second attempt has started
        assert sup.tasks["flaky"].started_value == "attempt 2"
        nursery.cancel_scope.cancel()
