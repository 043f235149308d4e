"""``Supervisor.replace``: the operation a server's re-binding needs (the new task starts while the old one still
runs, then the old one is retired and forgotten), and no module but the supervisor's own touching its task table.
Time is the suite's autojump clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import trio

from nvdaemon.supervise import Supervisor, TaskState

PACKAGE = Path(__file__).resolve().parent.parent / "nvdaemon"


class Server:
    """A supervised function that records when each run starts and ends, and fails ``fail`` times before it is
    ready (so the supervisor counts restarts)."""

    def __init__(self, label: str, fail: int = 0) -> None:
        self.label = label
        self.fail = fail
        self.runs = 0
        self.ended = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        self.runs += 1
        if self.fail:
            self.fail -= 1
            raise OSError("address in use")
        task_status.started(self.label)
        try:
            await trio.sleep_forever()
        finally:
            self.ended.set()


async def test_replace_starts_the_new_task_before_the_old_one_is_retired_then_cancels_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    old, new = Server("old", fail=2), Server("new")
    retired: list[tuple[str, bool]] = []

    async def retire(st: TaskState) -> None:
        # Called once the new task has started, with the old one still running and no longer listed.
        retired.append((st.state, old.ended.is_set()))
        assert sup.get("svc") is not st and sup.get("svc") is not None

    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery, jitter=lambda: 0.0)
        assert await sup.start("svc", old.serve, critical=True, fingerprint=1) is None  # the first attempt failed
        first = sup.get("svc")
        assert first is not None
        while first.state != "running":
            await trio.sleep(0.1)
        assert first.restarts == 2 and first.consecutive_failures == 2

        value = await sup.replace("svc", new.serve, critical=True, fingerprint=2, retire=retire)

        assert value == "new"
        assert retired == [("running", False)]
        assert old.ended.is_set() and first.done.is_set() and first.state == "stopped"
        current = sup.get("svc")
        assert current is not None and current is not first
        assert current.state == "running" and current.fingerprint == 2 and current.critical
        # The old task's failures stay with it: the new one has none, and /healthz cannot call it stuck.
        assert (current.restarts, current.consecutive_failures, current.last_error) == (0, 0, None)
        assert list(sup.states()) == ["svc"] and sup.states()["svc"] is current
        assert not new.ended.is_set()
        nursery.cancel_scope.cancel()


async def test_replace_without_retire_cancels_the_old_task(autojump_clock: trio.testing.MockClock) -> None:
    old, new = Server("old"), Server("new")
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery)
        await sup.start("svc", old.serve)
        assert await sup.replace("svc", new.serve) == "new"
        assert old.ended.is_set() and not new.ended.is_set()
        await sup.stop("svc")
        assert new.ended.is_set() and sup.get("svc") is None
        nursery.cancel_scope.cancel()


async def test_replacing_an_unknown_task_is_an_error_and_starts_nothing(autojump_clock: trio.testing.MockClock) -> None:
    server = Server("new")
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery)
        with pytest.raises(KeyError, match="no task 'svc' to replace"):
            await sup.replace("svc", server.serve)
        assert server.runs == 0 and not sup.states()
        nursery.cancel_scope.cancel()


def test_states_is_read_only() -> None:
    sup = Supervisor(nursery=None)  # type: ignore[arg-type]  # nothing is started
    with pytest.raises(TypeError):
        sup.states()["x"] = TaskState(name="x", critical=False)  # type: ignore[index]


def supervisor_table_uses(path: Path) -> list[str]:
    """``<expr>.tasks`` where ``<expr>`` names a supervisor (``sup``, ``supervisor``, ``self.supervisor``...)."""
    uses = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "tasks":
            owner = ast.unparse(node.value)
            if "sup" in owner.rsplit(".", 1)[-1].lower():
                uses.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {ast.unparse(node)}")
    return uses


def test_only_the_supervisor_touches_its_task_table() -> None:
    """The agent asks the supervisor (``get``, ``states``, ``replace``, ``stop``), never edits its table."""
    uses = [u for p in sorted(PACKAGE.rglob("*.py")) if p.name != "supervise.py" for u in supervisor_table_uses(p)]
    assert uses == []
