"""One supervisor for every long-lived task: start with ``nursery.start``, restart on an exception with capped
exponential backoff and jitter, record restarts and the last error, and never swallow ``trio.Cancelled``.

A supervised function has the shape ``async def serve_x(*args, task_status)``: it calls ``task_status.started()``
when it is truly ready (server bound, first tick taken). The supervisor's own ``start`` returns once the first
attempt has started, or once it has failed (it then keeps retrying in the background, so one broken collector can
never hold up the agent's start).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import trio

from nvdaemon.backoff import EQUAL, backoff

log = logging.getLogger(__name__)

ServeFn = Callable[..., Awaitable[None]]


@dataclass
class TaskState:
    """What ``/v1/status`` and the metrics show about one supervised task."""

    name: str
    critical: bool
    fingerprint: Hashable = None
    state: str = "starting"  # starting | running | backoff | stopped
    restarts: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    started_at: float | None = None
    running_since: float = 0.0  # trio clock of the current run's start
    started_value: Any = None  # what the latest run reported through task_status.started (a server: its binds)
    scope: trio.CancelScope = field(default_factory=trio.CancelScope, repr=False)
    done: trio.Event = field(default_factory=trio.Event, repr=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "critical": self.critical,
            "restarts": self.restarts,
            "consecutiveFailures": self.consecutive_failures,
            "lastError": self.last_error,
            "lastErrorAt": self.last_error_at,
            "startedAt": self.started_at,
        }


def describe(exc: BaseException) -> str:
    """``Type: message`` of the first leaf of an exception group, which is what an operator wants to read."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Supervisor:
    nursery: trio.Nursery
    backoff_base: float = 0.5
    backoff_max: float = 60.0
    stable_after: float = 60.0  # a run this long resets the failure streak
    stuck_after: int = 3  # this many failures in a row: a critical task counts as stuck (/healthz 503)
    jitter: Callable[[], float] = random.random
    tasks: dict[str, TaskState] = field(default_factory=dict)
    stopping: bool = False

    def backoff(self, failures: int) -> float:
        """Capped exponential delay with equal jitter: half fixed (a floor), half random (no thundering herd)."""
        return backoff(failures, self.backoff_base, self.backoff_max, EQUAL, self.jitter())

    async def start(
        self, name: str, fn: ServeFn, *args: Any, critical: bool = False, fingerprint: Hashable = None
    ) -> Any:
        """Start ``fn(*args)`` under supervision as ``name``; replaces a running task of the same name. Returns what
        the first attempt passed to ``task_status.started`` (None when that attempt failed)."""
        if name in self.tasks:
            await self.stop(name)
        st = TaskState(name=name, critical=critical, fingerprint=fingerprint)
        self.tasks[name] = st
        return await self.nursery.start(self._run, st, fn, args)

    async def replace(
        self,
        name: str,
        fn: ServeFn,
        *args: Any,
        critical: bool = False,
        fingerprint: Hashable = None,
        retire: Callable[[TaskState], Awaitable[None]] | None = None,
    ) -> Any:
        """Start ``fn(*args)`` as ``name`` while the task now under that name keeps running, then retire the old
        one: ``retire(old)`` first when given (a server's graceful stop), then it is cancelled and waited for. A
        server taking over its predecessor's sockets so is never without a listener. The new task starts with its
        own state (no restarts, no failures of the old one). Returns what ``start`` returns; KeyError when no task
        is named ``name``."""
        old = self.tasks.get(name)
        if old is None:
            raise KeyError(f"no task {name!r} to replace")
        st = TaskState(name=name, critical=critical, fingerprint=fingerprint)
        self.tasks[name] = st  # the old one is no longer ours to restart or list: only to stop
        value = await self.nursery.start(self._run, st, fn, args)
        if retire is not None:
            await retire(old)
        old.scope.cancel()
        await old.done.wait()
        return value

    async def stop(self, name: str) -> None:
        """Cancel one task and wait until it has finished its cleanup."""
        st = self.tasks.pop(name, None)
        if st is not None:
            st.scope.cancel()
            await st.done.wait()

    def get(self, name: str) -> TaskState | None:
        """The task ``name``, when one is supervised under that name."""
        return self.tasks.get(name)

    def states(self) -> Mapping[str, TaskState]:
        """Every supervised task by name, in start order, read only (``/v1/status``, the shutdown's stop order)."""
        return MappingProxyType(self.tasks)

    def stuck(self) -> list[str]:
        """Critical tasks that failed ``stuck_after`` times in a row and have not since run stably."""
        now = trio.current_time()
        return [
            t.name
            for t in self.tasks.values()
            if t.critical
            and t.consecutive_failures >= self.stuck_after
            and not (t.state == "running" and now - t.running_since >= self.stable_after)
        ]

    async def _run(self, st: TaskState, fn: ServeFn, args: tuple[Any, ...], task_status: trio.TaskStatus[Any]) -> None:
        reported = False
        try:
            with st.scope:
                while True:
                    st.state = "starting"
                    began = trio.current_time()
                    try:
                        async with trio.open_nursery() as inner:
                            st.started_value = await inner.start(lambda task_status: fn(*args, task_status=task_status))
                            st.state, st.started_at, st.running_since = "running", time.time(), trio.current_time()
                            if not reported:
                                reported = True
                                task_status.started(st.started_value)
                        log.info("task %s finished", st.name)
                        st.state = "stopped"
                        return
                    except Exception as exc:
                        if trio.current_time() - began >= self.stable_after:
                            st.consecutive_failures = 0
                        st.consecutive_failures += 1
                        st.last_error, st.last_error_at = describe(exc), time.time()
                        if self.stopping:
                            st.state = "stopped"
                            return
                        delay = self.backoff(st.consecutive_failures)
                        log.error(
                            "task %s failed (%s); restart %d in %.1fs",
                            st.name,
                            st.last_error,
                            st.restarts + 1,
                            delay,
                            exc_info=exc if st.consecutive_failures == 1 else None,
                        )
                        st.state = "backoff"
                        if not reported:
                            reported = True
                            task_status.started()
                        await trio.sleep(delay)
                        st.restarts += 1
        finally:
            if st.state != "stopped":
                st.state = "stopped"
            st.done.set()
