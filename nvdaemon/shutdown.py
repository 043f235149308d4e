"""The shutdown deadline: the point on trio's clock by which every shielded cleanup step has to end.

A task that is stopped (cancelled) may still have to finish something the cancellation must not cut short: a sink's
final flush in its ``serve`` ``finally``, the GPU close, the agent's final engine-state persist, the HTTP stop. Each
such step runs under ``bounded_shield(budget)``: shielded from the cancellation that stops its task, and ended after
its own ``budget`` (seconds) or at the shutdown deadline, whichever comes first.

``Agent.run`` sets the deadline (``set_deadline``) when SIGTERM/SIGINT arrives; steps already under way then (a sink
a reload is replacing) are held to it too. Before that it is ``+inf`` and only the budgets apply (a reload replacing
a sink, a crash). The deadline is kept per trio run (a ``trio.lowlevel.RunVar``), so nothing needs the agent to find
it and nothing leaks from one run (or test) to the next. No files are read.

The exit guard is the last resort for what no cancellation reaches: a worker thread stuck in a blocking call (a
hung disk under stateDir, NVML, a read on a FIFO) keeps ``trio.run`` from returning, since
``trio.to_thread.run_sync`` without ``abandon_on_cancel`` waits for its thread. ``nvdaemon run`` starts it
(``EXIT_GUARD.start``); the SIGTERM/SIGINT handler itself arms it (``arm_on_signals``), so it is armed even while
trio's loop is blocked. When the process is still alive ``GUARD_MARGIN_SECONDS`` after the shutdown deadline, it
logs which threads are still running and where, flushes the log handlers (waiting at most ``FLUSH_SECONDS``) and
ends the process with ``os._exit(EXIT_OVERRAN)``. A second signal arms it for the margin alone.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType

import trio
from trio.lowlevel import RunVar


@dataclass
class _Shutdown:
    deadline: float = math.inf
    open: set[trio.CancelScope] = field(default_factory=set)  # the bounded shields now running


_STATE: RunVar[_Shutdown] = RunVar("nvdaemon.shutdown")


def _state() -> _Shutdown:
    try:
        return _STATE.get()
    except LookupError:
        state = _Shutdown()
        _STATE.set(state)
        return state


def deadline() -> float:
    """The shutdown deadline of this trio run (trio clock, seconds); ``math.inf`` while the agent is not stopping."""
    return _state().deadline


def set_deadline(when: float) -> None:
    """Bounded shields entered from now on end by ``when`` (trio clock, seconds); those running now are held to it
    too when it is earlier than theirs (a later one never extends them: the agent moves the deadline on from its
    tasks' cleanup to its own final steps)."""
    state = _state()
    state.deadline = when
    for scope in state.open:
        scope.deadline = min(scope.deadline, when)


@contextlib.contextmanager
def bounded_shield(budget: float) -> Iterator[trio.CancelScope]:
    """A cancel scope shielded from outer cancellation that ends after ``budget`` seconds or at the shutdown
    deadline, whichever comes first. What it cuts short is cancelled, not raised: see ``cancelled_caught`` on the
    scope it yields."""
    state = _state()
    scope = trio.CancelScope(shield=True, deadline=min(trio.current_time() + budget, state.deadline))
    state.open.add(scope)
    try:
        with scope:
            yield scope
    finally:
        state.open.discard(scope)


# ---- the exit guard ------------------------------------------------------------------------------------------------
EXIT_OVERRAN = 1  # the documented "runtime failure": the orderly shutdown did not finish (work was abandoned)
GUARD_MARGIN_SECONDS = 0.5  # after the deadline: trio's own unwinding and the interpreter's exit fit in it
FLUSH_SECONDS = 1.0  # the guard's last log line and flush; a handler blocked on a full pipe is not waited for

log = logging.getLogger("nvdaemon.shutdown")
Handler = Callable[[int, FrameType | None], object]


class ExitGuard:
    """A daemon thread that ends the process once the shutdown deadline has passed (module docstring). Idle until
    armed: it blocks on a pipe, no timer runs."""

    def __init__(self) -> None:
        self._read = self._write = -1
        self._deadline = math.inf  # time.monotonic()
        self._grace = 0.0  # shutdownGraceSeconds the first signal armed it with (for the log line)
        self.armed = 0  # times armed (signals received)

    @property
    def started(self) -> bool:
        return self._write >= 0

    def start(self) -> None:
        if self.started:
            return
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        threading.Thread(target=self._watch, name="exit-guard", daemon=True).start()

    def arm(self, grace: float) -> None:
        """Exit ``grace`` + ``GUARD_MARGIN_SECONDS`` seconds from now at the latest (an earlier arming stands).
        Safe in a signal handler: no lock is taken, only assignments and a non-blocking write."""
        if not self.started:
            return
        self.armed += 1
        if self.armed == 1:
            self._grace = grace
        self._deadline = min(self._deadline, time.monotonic() + grace + GUARD_MARGIN_SECONDS)
        with contextlib.suppress(OSError):  # a full pipe: the guard is awake already
            os.write(self._write, b"!")

    def _watch(self) -> None:
        os.read(self._read, 64)
        while (left := self._deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:  # armed again (a second signal): maybe earlier
                os.read(self._read, 64)
        self._fire()

    def _fire(self) -> None:
        message = (
            "shutdown overran its deadline (shutdownGraceSeconds %gs + %gs): exiting now with code %d; "
            "still running: %s"
        )
        args = (self._grace, GUARD_MARGIN_SECONDS, EXIT_OVERRAN, "; ".join(still_running()) or "nothing")
        done = threading.Thread(target=_log_and_flush, args=(message, args), name="exit-guard-log", daemon=True)
        done.start()
        done.join(FLUSH_SECONDS)
        os._exit(EXIT_OVERRAN)


def _log_and_flush(message: str, args: tuple[object, ...]) -> None:
    log.error(message, *args)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()


def still_running() -> list[str]:
    """Every thread but the guard's: its name, where it is (the innermost frame) and the agent's frame nearest to
    it (what called the blocking function)."""
    frames = sys._current_frames()
    out = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident or -1)
        if frame is None or thread.name.startswith("exit-guard"):
            continue
        out.append(f"{thread.name}: {_where(frame)}")
    return out


def _where(frame: FrameType) -> str:
    top = f"{frame.f_code.co_name} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"
    own: FrameType | None = frame
    while own is not None and f"{os.sep}nvdaemon{os.sep}" not in own.f_code.co_filename:
        own = own.f_back
    if own is None or own is frame:
        return top
    return f"{top} from {own.f_code.co_name} ({os.path.basename(own.f_code.co_filename)}:{own.f_lineno})"


EXIT_GUARD = ExitGuard()


def arm_on_signals(signums: Iterable[signal.Signals], grace: Callable[[], float]) -> None:
    """Wrap the handlers installed now for ``signums`` (trio's, inside ``open_signal_receiver``, which restores the
    originals when it ends) so that the signal itself arms ``EXIT_GUARD``: the first with ``grace()``
    (``shutdownGraceSeconds`` in force), any later one with 0. Python runs a handler in the main thread even while
    that thread is blocked in a system call, so the guard is armed when trio's loop cannot run. A no-op for the
    guard when it was not started (the agent inside a test process)."""
    for signum in signums:
        previous = signal.getsignal(signum)
        if callable(previous):
            signal.signal(signum, _arming(previous, grace))


def _arming(previous: Handler, grace: Callable[[], float]) -> Handler:
    def handler(num: int, frame: FrameType | None) -> None:
        EXIT_GUARD.arm(grace() if EXIT_GUARD.armed == 0 else 0.0)
        previous(num, frame)

    return handler
