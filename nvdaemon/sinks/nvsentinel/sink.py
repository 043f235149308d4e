"""The NVSentinel health-monitor sink (``sinks.nvsentinel``): on every bus event and every ``intervalSeconds`` tick,
the reconciler (``reconciler``) publishes the difference between desired and reported health to the
platform-connector (``wire``) and saves what was acknowledged (``state``).

A sink replaced by a reload hands its send counters, the XIDs and lost GPUs it knew of and the events still in its
channel to its successor (``take_over``), which adds them to what it loads from its state file.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from nvdaemon.engine import rule_key
from nvdaemon.exposition import Metric
from nvdaemon.model import Event
from nvdaemon.sinks.base import BusSubscriber, ObservableDefaults, Sink, SinkContext
from nvdaemon.sinks.nvsentinel.map import CheckSpec, Health, Key
from nvdaemon.sinks.nvsentinel.reconciler import Reconciler
from nvdaemon.sinks.nvsentinel.state import BOOT_ID, STATE_FILE, lost_record, xid_record
from nvdaemon.sinks.nvsentinel.wire import GrpcPublisher, bearer_token, classify, to_proto

if TYPE_CHECKING:
    from nvdaemon.config import Rule


class NvsentinelHealthSink(BusSubscriber, ObservableDefaults):
    """Built from a ``SinkContext``: the node, stateDir, procRoot (boot id), tick interval and which checks exist
    (tiers, ``gpu.xid``) are kept from it, so a reload that changes one of them replaces the sink (new reconciler,
    new state file, new node name); the rules in force, the active conditions and the GPUs are read through its
    callbacks on every reconcile."""

    name = "nvsentinel"
    capacity = 4096

    def __init__(self, ctx: SinkContext, reconciler: Reconciler | None = None) -> None:
        self.settings = ctx.nvsentinel
        self.node = ctx.node
        self.state_dir = ctx.state_dir
        self.proc_root = ctx.proc_root
        self.interval = ctx.interval_seconds
        self.gpu_enabled = "gpu" in ctx.tiers
        self.xid_enabled = self.gpu_enabled and ctx.gpu_xid
        self._note_change = ctx.note_change
        self._rules = ctx.rules
        self._active = ctx.active_conditions
        self._gpus_lost = ctx.gpus_lost
        self._gpus_answering = ctx.gpus_answering
        self._kernel_overrides = ctx.kernel_overrides
        self.reconciler = reconciler or Reconciler(
            self.settings,
            node=self.node,
            state_path=self.state_dir / STATE_FILE,
            boot_id_path=Path(self.proc_root) / BOOT_ID,
        )
        self._seen_version = 0
        self._keyed: tuple[Sequence[Rule], dict[str, Rule], list[CheckSpec]] | None = None
        self._inherited: tuple[Reconciler, list[Event]] | None = None  # the replaced sink's (``take_over``)

    def fingerprint(self) -> Hashable:
        return (
            msgspec.json.encode(self.settings),
            self.node,
            str(self.state_dir),
            self.proc_root,
            self.interval,
            self.gpu_enabled,
            self.xid_enabled,
        )

    def _by_rules(self, rules: Sequence[Rule]) -> tuple[dict[str, Rule], list[CheckSpec]]:
        """The rules by the key their conditions carry, and the checks they make (with the XID and lost-GPU
        checks): computed again only when the rules in force change (a reload), not on every reconcile."""
        if self._keyed is None or self._keyed[0] is not rules:
            checks = self.reconciler.checks(rules, self.xid_enabled, self.gpu_enabled)
            self._keyed = (rules, {rule_key(r): r for r in rules}, checks)
        return self._keyed[1], self._keyed[2]

    def _inputs(self) -> tuple[dict[Key, Health], list[CheckSpec]]:
        rules = self._rules()
        rec = self.reconciler
        # A GPU lost before this sink subscribed (enabled or replaced by a reload: its ENTER went to no one, or to
        # the sink that was stopped) is reported all the same; noting a known one again changes nothing.
        for ev in self._gpus_lost():
            rec.note_event(ev)
        # A GPU lost before a restart of the agent clears once it answers in this one.
        rec.gpus_answering(self._gpus_answering())
        keyed, checks = self._by_rules(rules)
        return rec.desired(self._active(), keyed, self._kernel_overrides()), checks

    async def tick(self) -> None:
        desired, checks = self._inputs()
        await self.reconciler.reconcile(desired, checks)
        if self.reconciler.version != self._seen_version:
            self._seen_version = self.reconciler.version
            self._note_change()

    def take_over(self, old: Sink) -> None:
        """Replacing ``old``: its counters carry on now; the XIDs and lost GPUs it knew (maybe not yet saved) and
        the events its channel still holds are added once this sink has loaded its state file (``serve``)."""
        if not isinstance(old, NvsentinelHealthSink):
            return
        mine, theirs = self.reconciler, old.reconciler
        mine.success += theirs.success
        mine.skipped += theirs.skipped
        mine.errors.update(theirs.errors)
        old._adopt_inherited()  # replaced before its task loaded its file: what it inherited passes on too
        self._inherited = (theirs, old.leftovers())
        self._note_change()

    def _adopt_inherited(self) -> None:
        if self._inherited is None:
            return
        theirs, events = self._inherited
        self._inherited = None
        rec = self.reconciler
        for xid_key, xid in theirs.xids.items():
            if xid_key not in rec.xids:
                rec.xids[xid_key] = xid
                rec.dirty = True
        for gpu_key, gpu in theirs.lost.items():
            if gpu_key not in rec.lost:
                rec.lost[gpu_key] = gpu
                rec.dirty = True
        for ev in events:
            rec.note_event(ev)

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.reconciler.load)
        self._adopt_inherited()
        task_status.started()
        while True:
            await self.tick()
            with trio.move_on_after(self.interval):
                self.reconciler.note_event(await self.events.receive())
                while True:  # take everything already queued, then reconcile once
                    try:
                        self.reconciler.note_event(self.events.receive_nowait())
                    except trio.WouldBlock:
                        break

    def close(self) -> None:
        """Unsubscribe, and close the connection to the platform-connector (replaced, removed or stopping)."""
        super().close()
        self.reconciler.close()

    def metrics(self) -> Iterable[Metric]:
        return self.reconciler.metrics()

    def state(self) -> dict[str, Any]:
        return self.reconciler.state()

    def degraded(self) -> str | None:
        error = self.reconciler.state_error
        return f"state not writable: {error}" if error else None

    def state_writable(self) -> bool | None:
        return self.reconciler.state_error is None


__all__ = [
    "BOOT_ID",
    "STATE_FILE",
    "GrpcPublisher",
    "NvsentinelHealthSink",
    "Reconciler",
    "bearer_token",
    "classify",
    "lost_record",
    "to_proto",
    "xid_record",
]
