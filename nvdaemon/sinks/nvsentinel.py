"""The NVSentinel health-monitor sink (``sinks.nvsentinel``): on every bus event and every ``intervalSeconds`` tick,
the reconciler (``nvsentinel_reconciler``) publishes the difference between desired and reported health to the
platform-connector (``nvsentinel_wire``) and saves what was acknowledged (``nvsentinel_state``).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio
from prometheus_client.core import Metric

from nvdaemon.sinks import Sink
from nvdaemon.sinks.nvsentinel_map import CheckSpec, Health, Key
from nvdaemon.sinks.nvsentinel_reconciler import Reconciler
from nvdaemon.sinks.nvsentinel_state import BOOT_ID, STATE_FILE, lost_record, xid_record
from nvdaemon.sinks.nvsentinel_wire import GrpcPublisher, classify, read_token, to_proto

if TYPE_CHECKING:
    from nvdaemon.app import Agent


class NvsentinelHealthSink(Sink):
    name = "nvsentinel"
    capacity = 4096

    def __init__(self, agent: Agent, reconciler: Reconciler | None = None) -> None:
        self.agent = agent
        loaded = agent.loaded
        self.settings = loaded.config.sinks.nvsentinel
        self.reconciler = reconciler or Reconciler(
            self.settings,
            node=agent.node,
            state_path=loaded.state_dir / STATE_FILE,
            boot_id_path=Path(loaded.config.proc_root) / BOOT_ID,
        )
        self._seen_version = 0

    def fingerprint(self) -> Hashable:
        c = self.agent.loaded.config
        return (msgspec.json.encode(self.settings), self.agent.node, str(self.agent.loaded.state_dir), c.proc_root)

    def _inputs(self) -> tuple[dict[Key, Health], list[CheckSpec]]:
        agent = self.agent
        rules = {cr.key: cr.rule for crs in agent.rules.values() for cr in crs}
        gpu_enabled = "gpu" in agent.loaded.tiers
        xid_enabled = gpu_enabled and agent.loaded.config.gpu.xid
        rec = self.reconciler
        if agent.gpu is not None:
            # A GPU lost before this sink subscribed (enabled or replaced by a reload: its ENTER went to no one, or to
            # the sink that was stopped) is reported all the same; noting a known one again changes nothing.
            for ev in agent.gpu.lost_enters():
                rec.note_event(ev)
            # A GPU lost before a restart of the agent clears once it answers in this one.
            rec.gpus_answering(agent.gpu.answering())
        desired = rec.desired(agent.engine.active.values(), rules)
        return desired, rec.checks(agent.loaded.config.rules, xid_enabled, gpu_enabled)

    async def tick(self) -> None:
        desired, checks = self._inputs()
        await self.reconciler.reconcile(desired, checks)
        if self.reconciler.version != self._seen_version:
            self._seen_version = self.reconciler.version
            self.agent.changes += 1

    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await trio.to_thread.run_sync(self.reconciler.load)
        task_status.started()
        interval = self.agent.loaded.config.interval_seconds
        while True:
            await self.tick()
            with trio.move_on_after(interval):
                self.reconciler.note_event(await self.events.receive())
                while True:  # take everything already queued, then reconcile once
                    try:
                        self.reconciler.note_event(self.events.receive_nowait())
                    except trio.WouldBlock:
                        break

    def metrics(self) -> Iterable[Metric]:
        return self.reconciler.metrics()

    def state(self) -> dict[str, Any]:
        return self.reconciler.state()

    def degraded(self) -> str | None:
        error = self.reconciler.state_error
        return f"state not writable: {error}" if error else None

    def state_writable(self) -> bool | None:
        return self.reconciler.state_error is None


def build(agent: Agent) -> list[Sink]:
    if not agent.loaded.config.sinks.nvsentinel.enabled:
        return []
    return [NvsentinelHealthSink(agent)]


__all__ = [
    "BOOT_ID",
    "STATE_FILE",
    "GrpcPublisher",
    "NvsentinelHealthSink",
    "Reconciler",
    "build",
    "classify",
    "lost_record",
    "read_token",
    "to_proto",
    "xid_record",
]
