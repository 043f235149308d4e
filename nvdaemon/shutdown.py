"""The shutdown deadline: the point on trio's clock by which every shielded cleanup step has to end.

A task that is stopped (cancelled) may still have to finish something the cancellation must not cut short: a sink's
final flush in its ``serve`` ``finally``, the GPU close, the agent's final engine-state persist, the HTTP stop. Each
such step runs under ``bounded_shield(budget)``: shielded from the cancellation that stops its task, and ended after
its own ``budget`` (seconds) or at the shutdown deadline, whichever comes first.

``Agent.run`` sets the deadline (``set_deadline``) when SIGTERM/SIGINT arrives; steps already under way then (a sink
a reload is replacing) are held to it too. Before that it is ``+inf`` and only the budgets apply (a reload replacing
a sink, a crash). The deadline is kept per trio run (a ``trio.lowlevel.RunVar``), so nothing needs the agent to find
it and nothing leaks from one run (or test) to the next. No files are read.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

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
