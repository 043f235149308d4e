"""The suite's ``autojump_clock``: trio's ``MockClock`` that jumps only while no worker thread is at work.

pytest-trio's own fixture (``MockClock(autojump_threshold=0)``) jumps the virtual clock as soon as every task is
blocked, and a task waiting on ``trio.to_thread.run_sync`` is blocked. So while sqlite works in a thread, virtual
time runs on, and a ``fail_after``, a retry delay or a window's end comes due before the thread returns: whether a
test passes then depends on how fast the machine runs the thread, and on a busy 2-CPU runner it did not.

``ThreadHold`` (fixture ``thread_hold``) holds the clock (no autojump) from the moment a worker thread is started
until its result is back on the loop, through both ways the agent starts threads: ``trio.to_thread.run_sync`` and
``ReusableThread.run_soon`` (``nvdaemon/worker_thread.py``: the tier loops' round trip, ``nvdaemon/tiers.py``).
Virtual time then moves exactly as in production relative to the work, whatever the machine's load.

A thread a test keeps blocked on purpose would hold the clock for ever, so a hold lasts at most ``hold_limit`` real
seconds (far beyond any real thread's work here) before the clock jumps anyway. Each such jump is counted in
``expired_holds``, and the fixture fails the test at teardown, unless the test declared a stuck thread with
``thread_hold.expect_stuck_threads()`` (which turns the hold off for that test: the clock jumps as pytest-trio's
does).

``NVDAEMON_TEST_THREAD_DELAY`` (seconds; ``make test-busy`` sets it) makes every worker thread of a mock-clock test
sleep that long before its work, as on a machine too busy to run it at once: a test that still passes does not
depend on how fast its threads run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
import trio.testing

from nvdaemon.worker_thread import ReusableThread

HOLD_LIMIT = 60.0  # real seconds of a stuck thread before the clock jumps anyway
THREAD_DELAY = float(os.environ.get("NVDAEMON_TEST_THREAD_DELAY") or 0)  # real seconds, before each thread's work


def _delayed(fn: Callable[..., Any]) -> Callable[..., Any]:
    if not THREAD_DELAY:
        return fn

    @functools.wraps(fn)
    def late(*args: Any, **kwargs: Any) -> Any:
        time.sleep(THREAD_DELAY)
        return fn(*args, **kwargs)

    return late


class ThreadHold:
    """Holds ``clock`` (trio's ``MockClock``, which cannot be subclassed) while worker threads are in flight. Every
    method runs on the trio loop: a thread's release is sent there with ``run_sync_soon``."""

    def __init__(self, clock: trio.testing.MockClock, hold_limit: float = HOLD_LIMIT) -> None:
        self.clock = clock
        self.hold_limit = hold_limit
        self.in_flight = 0  # worker threads started and not yet back on the loop
        self.threads_seen = 0
        self.expired_holds = 0  # holds that lasted hold_limit real seconds or more: the clock may have jumped
        self.stuck_allowed = False

    def expect_stuck_threads(self) -> None:
        """This test blocks a worker thread on purpose and waits on virtual time meanwhile: no hold, the clock
        jumps whenever every task is blocked, as pytest-trio's own fixture does."""
        self.stuck_allowed = True
        self._set()

    def _set(self) -> None:
        held = self.in_flight and not self.stuck_allowed
        # While a thread works, jump only after hold_limit real seconds of idleness (a stuck thread), never sooner.
        self.clock.autojump_threshold = self.hold_limit if held else 0

    def hold(self) -> float:
        self.in_flight += 1
        self.threads_seen += 1
        self._set()
        return time.monotonic()

    def release(self, since: float) -> None:
        self.in_flight -= 1
        if time.monotonic() - since >= self.hold_limit and not self.stuck_allowed:
            self.expired_holds += 1
        self._set()


def _held_run_sync(hold: ThreadHold, real: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(real)
    async def run_sync(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # Released when the task stops waiting: the result is back, or (abandon_on_cancel) the thread was abandoned.
        since = hold.hold()
        try:
            return await real(_delayed(fn), *args, **kwargs)
        finally:
            hold.release(since)

    return run_sync


def _held_run_soon(hold: ThreadHold, real: Callable[[ReusableThread, Callable[[], None]], None]) -> Callable[..., None]:
    @functools.wraps(real)
    def run_soon(self: ReusableThread, job: Callable[[], None]) -> None:
        try:
            token = trio.lowlevel.current_trio_token()
        except RuntimeError:  # from a worker thread (the file system collector's statfs): its own thread holds
            real(self, _delayed(job))
            return
        since = hold.hold()

        def held() -> None:  # in the worker thread
            # The job first (it queues its result's callback on the loop), the release after it: callbacks run in
            # order, so the waiting task is runnable again before the clock may jump. Released first, the clock
            # could jump in between, while this thread had not yet queued the result (seen under load).
            try:
                _delayed(job)()
            finally:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(hold.release, since)

        real(self, held)

    return run_soon


@pytest.fixture
def thread_hold(monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadHold]:
    """The hold on the suite's ``autojump_clock``; a test that blocks a worker thread on purpose asks for this
    fixture and calls ``expect_stuck_threads()``."""
    hold = ThreadHold(trio.testing.MockClock(autojump_threshold=0))
    monkeypatch.setattr(trio.to_thread, "run_sync", _held_run_sync(hold, trio.to_thread.run_sync))
    monkeypatch.setattr(ReusableThread, "run_soon", _held_run_soon(hold, ReusableThread.run_soon))
    yield hold
    assert hold.expired_holds == 0, (
        f"{hold.expired_holds} worker thread(s) ran for over {hold.hold_limit:g} real seconds while the test waited "
        "on the mock clock; a test that blocks a thread on purpose calls thread_hold.expect_stuck_threads()"
    )


@pytest.fixture
def autojump_clock(thread_hold: ThreadHold) -> trio.testing.MockClock:
    """Replaces pytest-trio's fixture of the same name for the whole suite (see the module docstring)."""
    return thread_hold.clock
