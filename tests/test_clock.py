"""The suite's ``autojump_clock`` (tests/clock.py): virtual time stands still while a worker thread works, through
both ways the agent starts threads; without the hold (pytest-trio's plain ``MockClock``) the same test fails."""

from __future__ import annotations

import threading
import time

import trio
import trio.testing

from nvdaemon.tiers import _in_thread
from nvdaemon.worker_thread import ReusableThread
from tests.clock import ThreadHold

SLOW = 0.3  # real seconds of "work" in the thread


def slow_work() -> str:
    time.sleep(SLOW)
    return "done"


async def virtual_time_of_thread_work() -> float:
    """The virtual time a thread's work took, with a task sleeping 1000 s beside it (a deadline the clock can jump
    to, as a retry delay or a window's end is in the agent)."""
    began = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 1000)
        assert await trio.to_thread.run_sync(slow_work) == "done"
        took = trio.current_time() - began
        nursery.cancel_scope.cancel()
    return took


async def test_virtual_time_stands_still_while_to_thread_works(autojump_clock: trio.testing.MockClock) -> None:
    assert await virtual_time_of_thread_work() == 0


async def test_virtual_time_stands_still_while_a_tier_thread_round_trip_works(
    autojump_clock: trio.testing.MockClock, thread_hold: ThreadHold
) -> None:
    # The tier loops' round trip (_in_thread in a ReusableThread), twice: in a new thread, then in the same one.
    done: list[str] = []
    worker = ReusableThread("tier core")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 1000)
        for _ in range(2):
            began = trio.current_time()
            await _in_thread(lambda: done.append(slow_work()), trio.CapacityLimiter(1), worker)
            assert trio.current_time() == began
        assert done == ["done", "done"] and thread_hold.threads_seen == 2 and worker.started <= 2
        nursery.cancel_scope.cancel()
    # The hold goes a moment after the result: the worker thread queues its release behind the result's callback,
    # so the task may run on before it lands. The clock jumps again once it has (with a hold it would not).
    began = trio.current_time()
    await trio.sleep(3600)
    assert trio.current_time() - began == 3600 and thread_hold.in_flight == 0


async def test_the_clock_jumps_again_once_the_thread_is_back(
    autojump_clock: trio.testing.MockClock, thread_hold: ThreadHold
) -> None:
    await trio.to_thread.run_sync(slow_work)
    assert thread_hold.in_flight == 0 and thread_hold.threads_seen == 1
    began = trio.current_time()
    await trio.sleep(3600)  # jumps at once: no thread holds the clock
    assert trio.current_time() - began == 3600


async def test_a_thread_stuck_on_purpose_lets_the_clock_jump(
    autojump_clock: trio.testing.MockClock, thread_hold: ThreadHold
) -> None:
    thread_hold.expect_stuck_threads()
    release = threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: trio.to_thread.run_sync(release.wait, abandon_on_cancel=True))
        await trio.testing.wait_all_tasks_blocked()
        assert thread_hold.in_flight == 1 and autojump_clock.autojump_threshold == 0  # in flight, yet not held
        with trio.fail_after(10):  # virtual: passes only because the clock jumps over the stuck thread
            await trio.sleep(5)
        nursery.cancel_scope.cancel()
    release.set()


def test_a_plain_mock_clock_jumps_while_the_thread_works() -> None:
    """What the hold prevents (pytest-trio's own fixture): the clock jumps 1000 s while the thread works 0.3 real
    seconds, so any deadline in between comes due before the thread's result."""
    took = trio.run(virtual_time_of_thread_work, clock=trio.testing.MockClock(autojump_threshold=0))
    assert took == 1000
