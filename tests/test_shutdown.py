"""The shutdown deadline (``nvdaemon.shutdown``) and the agent's shutdown sequence on trio's autojump clock: the
deadline cuts a budget longer than what is left of it, also for a shield already running when it is set; the sinks
stop side by side, each held to ``min(its budget, the deadline)``, and the final persist still runs after them."""

from __future__ import annotations

import json
import math
from collections.abc import Hashable
from pathlib import Path

import pytest
import trio
import trio.testing

import nvdaemon.sinks
from nvdaemon import shutdown
from nvdaemon.app import FINAL_SHARE, Agent
from nvdaemon.configload import parse_config
from nvdaemon.model import Event, Phase
from nvdaemon.sinks import BusSubscriber, ObservableDefaults
from nvdaemon.supervise import Supervisor


async def test_outside_a_shutdown_only_the_budget_bounds_and_outer_cancellation_is_kept_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    assert shutdown.deadline() == math.inf
    start = trio.current_time()
    with trio.CancelScope() as outer:
        outer.cancel()
        with shutdown.bounded_shield(3.0) as scope:
            await trio.sleep(10)  # not cancelled by `outer`: shielded
    assert scope.cancelled_caught
    assert trio.current_time() - start == 3.0


async def test_the_deadline_cuts_a_longer_budget(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    shutdown.set_deadline(start + 1.5)
    with shutdown.bounded_shield(5.0) as scope:
        await trio.sleep(10)
    assert scope.cancelled_caught
    assert trio.current_time() - start == 1.5
    # A budget shorter than what is left of the deadline is its own bound.
    shutdown.set_deadline(trio.current_time() + 10)
    with shutdown.bounded_shield(2.0):
        await trio.sleep(10)
    assert trio.current_time() - start == 3.5


async def test_a_shield_already_running_is_held_to_a_deadline_set_later_but_never_extended(
    autojump_clock: trio.testing.MockClock,
) -> None:
    start = trio.current_time()
    ended: dict[str, float] = {}

    async def step(name: str, budget: float) -> None:
        with shutdown.bounded_shield(budget):
            await trio.sleep(100)
        ended[name] = trio.current_time() - start

    async with trio.open_nursery() as nursery:
        nursery.start_soon(step, "long", 30.0)
        nursery.start_soon(step, "short", 2.0)
        await trio.sleep(1)
        shutdown.set_deadline(trio.current_time() + 4)  # SIGTERM while both flush
        shutdown.set_deadline(trio.current_time() + 50)  # the agent's final steps: later, for new shields only
    assert ended == {"short": 2.0, "long": 5.0}


def test_each_trio_run_starts_without_a_deadline() -> None:
    async def stopping() -> None:
        shutdown.set_deadline(trio.current_time() + 1)
        assert shutdown.deadline() < math.inf

    trio.run(stopping)
    assert trio.run(_deadline) == math.inf  # kept per run (a RunVar): nothing leaks into the next agent or test


async def _deadline() -> float:
    return shutdown.deadline()


class Stalling(BusSubscriber, ObservableDefaults):
    """A sink whose final flush never finishes on its own; it records when the flush began and ended."""

    def __init__(self, name: str, budget: float) -> None:
        self.name = name
        self.budget = budget
        self.flush: tuple[float, float] | None = None

    def fingerprint(self) -> Hashable:
        return self.name

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            await trio.sleep_forever()
        finally:
            began = trio.current_time()
            with shutdown.bounded_shield(self.budget):
                await trio.sleep_forever()
            self.flush = (began, trio.current_time())


async def test_sinks_stop_side_by_side_within_the_deadline_and_the_final_persist_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    grace = 6.0
    agent = Agent(parse_config(f"stateDir: {tmp_path}\nshutdownGraceSeconds: {grace}\n", "t.yaml", env={}))
    # The old budgets: webhook drains 2 s each, stream 2 s, history 5 s: 11 s one after another.
    built = [Stalling("webhook:a", 2), Stalling("webhook:b", 2), Stalling("stream", 2), Stalling("history", 5)]
    monkeypatch.setattr(nvdaemon.sinks, "BUILDERS", (lambda _agent: built,))
    async with trio.open_nursery() as root:
        agent.root_scope = root.cancel_scope
        agent.supervisor = sup = Supervisor(root)
        await agent.sync_sinks()
        agent.engine.seq = 7
        agent.emit([Event("e7", "n", "core", "cpu", "load_high", Phase.ENTER, "warning", 7, 0.0)])
        start = trio.current_time()
        await agent._shut_down(sup, grace)
        finished = trio.current_time()
    stop_by = start + grace * (1 - FINAL_SHARE)
    assert {s.name: s.flush for s in built} == {
        "webhook:a": (start, start + 2),
        "webhook:b": (start, start + 2),
        "stream": (start, start + 2),
        "history": (start, stop_by),  # its 5 s budget, cut by the deadline
    }
    assert finished <= start + grace
    assert json.loads((tmp_path / "engine.json").read_bytes())["seq"] == 7
    assert agent.bus.subscriptions == {}  # every sink closed once its task had stopped
