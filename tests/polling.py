"""The one way tests wait for a condition: ask ``predicate`` again every ``step`` seconds until it returns something
true (then return that), or fail with an AssertionError naming ``what`` after ``timeout`` seconds.

``until`` runs on the trio clock (so an ``autojump_clock`` test waits no real time) and also takes a predicate that
returns an awaitable (an async function); ``until_sync`` is for tests that drive subprocesses from plain threads.
The timeout is always the caller's: modules bind theirs once with ``functools.partial`` (e.g. ``wait_for`` in
tests/test_e2e.py), and a call may still override it.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import trio

What = str | Callable[[], str]


def _describe(what: What, timeout: float) -> str:
    text = what() if callable(what) else what
    return f"timed out after {timeout:g}s waiting for {text or 'the condition'}"


async def until(predicate: Callable[[], Any], what: What = "", *, timeout: float, step: float = 0.02) -> Any:
    """``predicate()`` (awaited when it returns an awaitable) until it is true; returns that result. ``what`` may be a
    callable, read only on timeout (e.g. to show what did arrive)."""
    try:
        with trio.fail_after(timeout):
            while True:
                result = predicate()
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return result
                await trio.sleep(step)
    except trio.TooSlowError:
        raise AssertionError(_describe(what, timeout)) from None


def until_sync(predicate: Callable[[], Any], what: What = "", *, timeout: float, step: float = 0.05) -> Any:
    """``until`` for plain (non-trio) code: blocks the thread, sleeping ``step`` seconds between calls; the predicate
    is always asked once more after the deadline has passed before this gives up."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(_describe(what, timeout))
        time.sleep(step)
