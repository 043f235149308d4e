"""The agent: the root nursery, what every task shares, start, reload and shutdown.

Start: load engine state from stateDir, start the HTTP server (ready when bound), then each tier loop (ready after
its first tick); ``/readyz`` turns 200 when all of them have started. SIGHUP reloads the config (``Agent.reload``):
a config that cannot be read, validated or applied is logged and counted and the running one kept, and only tasks
whose config changed are restarted. Reloads run in their own task, so no error of theirs reaches the root nursery
and a SIGTERM is answered while one is in progress. SIGTERM/SIGINT: the tier loops are cancelled, engine state is
flushed under a shielded deadline, hypercorn is stopped through its shutdown trigger, and the process exits 0
within ``shutdownGraceSeconds``. A second signal cuts the grace period short.

This module builds the parts and wires them together; each part gets the values and callbacks it uses, never the
agent: engine persistence is ``engine_store.py``, reload with rollback ``reloading.py``, the HTTP server's task and
its re-binding ``http_binding.py``, task supervision ``supervise.py``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import signal
import socket
import time
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from nvdaemon import engine, gcpause, shutdown
from nvdaemon.bus import EventBus
from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import Collector, HostRoots
from nvdaemon.compat.node_exporter import TABLE as NODE_EXPORTER_TABLE
from nvdaemon.compat.node_exporter.surface import node_exporter_collectors
from nvdaemon.config import Config, LoadedConfig, ServerConfig
from nvdaemon.engine_store import EngineStore
from nvdaemon.gpu import GpuRuntime, close_gpu, open_gpu, podresources
from nvdaemon.gpu.xid import TASK_NAME as XID_TASK
from nvdaemon.gpu.xid import serve_xid
from nvdaemon.gpu.xid_ledger import XidLedger
from nvdaemon.history.service import HistorySink
from nvdaemon.http_binding import HttpBinding
from nvdaemon.kmsg import service as kmsg_service
from nvdaemon.model import Event, TierSnapshot, new_event_id
from nvdaemon.reloading import Reloads, ReloadSteps, Rules, prepare_reload
from nvdaemon.sinks import Durable, Sink, SinkContext, SnapshotConsumer, build_sinks
from nvdaemon.statefile import atomic_write
from nvdaemon.supervise import Supervisor, TaskState
from nvdaemon.tiers import CollectorRunner, collect_tier
from nvdaemon.view import AgentView, EventKey, Surfaces
from nvdaemon.worker_thread import ReusableThread

if TYPE_CHECKING:
    from nvdaemon.kmsg.source import KmsgSource
    from nvdaemon.sinks.stream.hub import StreamHub

log = logging.getLogger(__name__)
events_log = logging.getLogger("nvdaemon.events")

DURABLE_WAIT_SECONDS = 1.0  # a save of engine state waits this long for the durable sinks (engine_store.py)
FINAL_SHARE = 0.25  # of shutdownGraceSeconds, kept for the final engine-state persist and the HTTP stop


class Agent:
    """Everything the tasks share. Only touched from the trio thread, so no locks beyond the engine store's."""

    def __init__(self, loaded: LoadedConfig, config_path: str | None = None, host_root: Path | None = None) -> None:
        self.loaded = loaded
        self.config_path = config_path
        self.host_root = host_root
        self.bus = EventBus()
        self.engine = engine.EngineState()
        self.rules = engine.compile_rules(loaded.config.rules)
        self.snapshots: dict[str, TierSnapshot] = {}
        self.gpu: GpuRuntime | None = None  # opened NVML (nvdaemon/gpu), when the gpu tier is configured and usable
        # One XID, one event, whichever of NVML and the kernel log reported it (gpu/xid_ledger.py).
        self.xids = XidLedger(node=loaded.node, emit=self.emit, next_seq=self.next_seq)
        kmsg_service.configure_ledger(self.xids, loaded.config.kernel_log)
        self.kernel_rules = kmsg_service.compiled_rules(loaded.config)
        self.kmsg: KmsgSource | None = None  # the kernel-log source while its task runs
        self.skipped_tiers: set[str] = set()  # configured but unusable on this node (gpu without NVML)
        self.sinks: dict[str, Sink] = {}
        self.history: HistorySink | None = None  # the history sink, when running (set by sync_sinks)
        self.stream: StreamHub | None = None  # the websocket hub, when running (set by sync_sinks)
        self.snapshot_version = 0
        self._snapshot_waiters = trio.lowlevel.ParkingLot()  # next_snapshot's
        self.heartbeats: dict[str, float] = {}  # trio clock of each tier's last completed tick
        self.ticks: dict[str, int] = {}  # completed ticks of each tier since the start (/healthz, /v1/status)
        self.event_counts: collections.Counter[EventKey] = collections.Counter()
        self.started_at = time.time()
        self.started_clock = 0.0
        self.ready = False
        self.started = trio.Event()  # the start sequence is done: a SIGHUP before it waits for it
        self.stopping = trio.Event()
        view: AgentView = self  # the server reads the agent only through this (mypy checks that the agent fits)
        self.http = HttpBinding(view)  # the HTTP server's task: where it listens, its re-binding on reload
        self.supervisor: Supervisor | None = None
        self.changes = 0  # bumped by anything that changes what /metrics shows besides snapshots and events
        self.reloading = Reloads(self.note_change)
        self.root_scope = trio.CancelScope()
        self.after_start: Callable[[], None] = lambda: None  # called once, when the start sequence is done
        self.store = EngineStore(
            lambda: self.loaded.state_dir,
            lambda: [s for s in self.sinks.values() if isinstance(s, Durable)],
            durable_wait=DURABLE_WAIT_SECONDS,
            write=lambda path, data: atomic_write(path, data),  # noqa: PLW0108 (this module's name, at each save)
        )

    # ---- config-derived views -------------------------------------------------------------------------------
    @property
    def node(self) -> str:
        return self.loaded.node

    @property
    def roots(self) -> HostRoots:
        c = self.loaded.config
        return HostRoots(proc=Path(c.proc_root), sys=Path(c.sys_root), dev=Path(c.dev_root), rootfs=Path(c.rootfs))

    def active_tiers(self) -> list[str]:
        """Configured tiers that have collectors in this build."""
        return [t for t in self.loaded.tiers if collectors_for_tier(t) and t not in self.skipped_tiers]

    def interval(self, tier: str) -> float:
        c = self.loaded.config
        return c.smart.interval_seconds if tier == "smart" else c.interval_seconds

    def tier_fingerprint(self, tier: str) -> Hashable:
        c = self.loaded.config
        # smartctl path, devices, timeouts; the node_exporter collectors and their filters run in the core tier
        section = {"smart": c.smart, "core": c.node_exporter}.get(tier)
        settings = msgspec.json.encode(section) if section is not None else b""
        return (tier, self.interval(tier), self.roots, c.collector_timeout_seconds, settings)

    def server_fingerprint(self) -> tuple[str, ServerConfig, float]:
        """Exactly what ``serve_http`` is given from the config (apiTokenFile's content it re-reads itself)."""
        c = self.loaded.config
        return c.sinks.metrics.listen_addr, c.server, c.shutdown_grace_seconds

    # ---- what the server reads besides the attributes (nvdaemon/view.py's AgentView) ------------------------
    @property
    def config_source(self) -> str:
        return self.loaded.source

    @property
    def tasks(self) -> Mapping[str, TaskState]:
        return self.supervisor.states() if self.supervisor is not None else {}

    @property
    def reloads(self) -> int:
        return self.reloading.applied

    @property
    def reload_failures(self) -> int:
        return self.reloading.rejected

    @property
    def last_reload_ok(self) -> bool:
        return self.reloading.last_ok

    @property
    def bound(self) -> list[str]:
        """Where the HTTP server listens."""
        return self.http.bound

    @property
    def http_shutdown(self) -> trio.Event:
        """The running HTTP server's graceful stop trigger."""
        return self.http.shutdown

    @property
    def surfaces(self) -> Surfaces:
        c = self.loaded.config
        return Surfaces(c.dcgm_compat.enabled, c.smartctl_compat.enabled, c.node_exporter.enabled)

    # ---- engine ---------------------------------------------------------------------------------------------
    @property
    def engine_path(self) -> Path:
        return self.store.path

    @property
    def engine_save_error(self) -> str | None:
        """Why the last engine.json write failed (a full stateDir), or None."""
        return self.store.save_error

    def load_engine(self) -> None:
        """Restore the engine state from stateDir (``EngineStore.load``)."""
        self.engine = self.store.load(self.engine)
        # Seqs up to here were published by the run before: a durable sink attached now has none of them to commit.
        self.bus.last_seq = max(self.bus.last_seq, self.engine.seq)

    async def persist_engine(self, *, strict: bool = False) -> None:
        """Save the engine state, never past an event a durable sink does not hold yet (``EngineStore.persist``);
        OSError only when ``strict`` and stateDir refuses the write."""
        await self.store.persist(self.engine, strict=strict)

    def emit(self, events: list[Event]) -> None:
        for ev in events:
            self.store.mark_dirty()
            self.event_counts[ev.count_key()] += 1
            detail = ev.detail
            events_log.info(
                "event %s %s severity=%s device=%s value=%s threshold=%s seq=%d id=%s",
                ev.phase.value,
                ev.condition,
                ev.severity,
                ev.device,
                detail.get("value"),
                detail.get("threshold"),
                ev.seq,
                ev.id,
                extra={"event": ev.wire()},  # the shape receivers get
            )
            self.bus.publish(ev)

    def on_snapshot(self, snap: TierSnapshot) -> None:
        self.snapshots[snap.tier] = snap
        self.snapshot_version += 1
        self._snapshot_waiters.unpark_all()
        self.emit(
            engine.evaluate(
                self.engine,
                self.rules,
                snap.samples,
                tier=snap.tier,
                node=self.node,
                now=snap.collected_at,
                new_id=new_event_id,
                pods=self.gpu.pods_of_device if self.gpu is not None and snap.tier == "gpu" else None,
            )
        )
        for sink in self.sinks.values():
            if isinstance(sink, SnapshotConsumer):  # history: in-memory accumulation; its task writes the windows
                sink.ingest(snap)

    # ---- health ---------------------------------------------------------------------------------------------
    def health_problems(self) -> list[str]:
        """Why /healthz fails: a tier loop that has not ticked in 3 intervals, or a critical task stuck failing. A
        tick may also wait up to DURABLE_WAIT_SECONDS for the webhook spool before it saves engine state (a spool
        that refuses writes, a reload replacing the endpoint): that is the loop running, so it is allowed for."""
        now = trio.current_time()
        problems = []
        for tier in self.active_tiers():
            last = self.heartbeats.get(tier, self.started_clock)
            if now - last > 3 * self.interval(tier) + DURABLE_WAIT_SECONDS:
                problems.append(f"tier {tier}: no completed tick for {now - last:.0f}s")
        if self.supervisor is not None:
            problems += [f"task {name}: failing repeatedly" for name in self.supervisor.stuck()]
        return problems

    # ---- lifecycle ------------------------------------------------------------------------------------------
    async def start_tasks(self) -> None:
        sup = self.supervisor
        assert sup is not None
        await self.start_http(None)
        await self.sync_sinks()
        for tier in self.loaded.tiers:
            if tier not in self.active_tiers():
                log.warning("tier %s is configured but has no collectors in this version; skipped", tier)
        for tier in self.active_tiers():
            await sup.start(
                f"tier:{tier}", serve_tier, self, tier, critical=True, fingerprint=self.tier_fingerprint(tier)
            )
        if self.gpu is not None and self.loaded.config.gpu.xid:
            await sup.start(XID_TASK, serve_xid, self.gpu, fingerprint=XID_TASK)
        await self.sync_podresources()  # GPU pod attribution (dcgmCompat.podAttribution)
        await self.sync_kmsg()

    async def next_snapshot(self, seen: int) -> int:
        """``snapshot_version`` once it is above ``seen`` (at once when it is already)."""
        while self.snapshot_version <= seen:
            await self._snapshot_waiters.park()
        return self.snapshot_version

    def note_change(self) -> None:
        """Something /metrics shows changed besides snapshots and events: the cached page is rendered again."""
        self.changes += 1

    def next_seq(self) -> int:
        """The next event sequence number, the engine's, so XIDs and rule events share one ordering."""
        return engine.draw_seq(self.engine)

    async def sync_podresources(self) -> None:
        """Start, restart (changed config) or stop the pod-resources refresh task, at start and after a reload."""
        sup = self.supervisor
        assert sup is not None
        cfg, interval = self.loaded.config.dcgm_compat, self.interval("gpu")
        fingerprint = podresources.fingerprint(cfg, interval)
        running = sup.get(podresources.TASK_NAME)
        wanted = self.gpu is not None and cfg.pod_attribution
        if running is not None and (not wanted or running.fingerprint != fingerprint):
            await sup.stop(podresources.TASK_NAME)
            running = None
        if self.gpu is not None and wanted and running is None:
            await sup.start(
                podresources.TASK_NAME,
                podresources.serve_podresources,
                self.gpu,
                cfg,
                interval,
                self.note_change,
                fingerprint=fingerprint,
            )

    async def sync_kmsg(self) -> None:
        """Start, restart (changed config) or stop the kernel-log source, at start and after a reload."""
        sup = self.supervisor
        assert sup is not None
        c = self.loaded.config
        fingerprint = kmsg_service.fingerprint(c, self.loaded.state_dir)
        running = sup.get(kmsg_service.TASK_NAME)
        if running is not None and (not c.kernel_log.enabled or running.fingerprint != fingerprint):
            await sup.stop(kmsg_service.TASK_NAME)
            self.kmsg = running = None
        if c.kernel_log.enabled and running is None:
            self.kmsg = self.kmsg_source(c)
            await sup.start(kmsg_service.TASK_NAME, self.kmsg.serve, fingerprint=fingerprint)

    def kmsg_source(self, c: Config) -> KmsgSource:
        """A kernel-log source reading under ``c``'s devRoot and procRoot into this agent's engine and ledger."""
        return kmsg_service.build_source(
            c,
            self.kernel_rules,
            state_dir=self.loaded.state_dir,
            node=self.node,
            state=lambda: self.engine,
            emit=self.emit,
            ledger=self.xids,
            persist_engine=self.persist_engine,
            held_seq=self.held_seq,
            gpu=self.gpu,
        )

    def held_seq(self) -> float:
        """The event seq every durable sink holds (math.inf when none runs: nothing to wait for)."""
        return min((s.committed_seq for s in self.sinks.values() if isinstance(s, Durable)), default=math.inf)

    def sink_context(self) -> SinkContext:
        """What the sinks are built from: the config in force now, and callbacks into the agent's live state."""
        loaded = self.loaded
        c = loaded.config
        return SinkContext(
            node=loaded.node,
            state_dir=loaded.state_dir,
            tiers=tuple(loaded.tiers),
            interval_seconds=c.interval_seconds,
            proc_root=c.proc_root,
            gpu_xid=c.gpu.xid,
            stream=c.sinks.stream,
            webhooks=tuple(c.sinks.webhook),
            spool=c.spool,
            nvsentinel=c.sinks.nvsentinel,
            history=c.history,
            note_change=self.note_change,
            rules=lambda: self.loaded.config.rules,
            active_conditions=lambda: list(self.engine.active.values()),
            gpus_lost=lambda: self.gpu.lost_enters() if self.gpu is not None else [],
            gpus_answering=lambda: self.gpu.answering() if self.gpu is not None else [],
            kernel_overrides=lambda: {cr.key: cr.rule.nvsentinel for cr in self.kernel_rules},
        )

    def _sink_handles(self) -> None:
        """The typed handles on the sinks other parts call into (snapshots to history, the websocket routes)."""
        history = self.sinks.get("history")
        self.history = history if isinstance(history, HistorySink) else None
        self.stream = None
        if "stream" in self.sinks:
            from nvdaemon.sinks.stream.hub import StreamHub  # loaded already: the hub was built from it

            stream = self.sinks["stream"]
            self.stream = stream if isinstance(stream, StreamHub) else None

    async def sync_sinks(self) -> None:
        """Start sinks the config asks for; keep unchanged ones running; replace changed ones; stop removed ones.
        A replacement takes over what the stopped sink still held and its counters (``Sink.take_over``) before
        anything else can run. The typed handles (``history``, ``stream``) follow ``sinks`` at each change, before
        any await."""
        sup = self.supervisor
        assert sup is not None
        wanted = {sink.name: sink for sink in build_sinks(self.sink_context())}
        for name in [
            n for n in self.sinks if n not in wanted or wanted[n].fingerprint() != self.sinks[n].fingerprint()
        ]:
            await sup.stop(name)
            old = self.sinks.pop(name)
            if name in wanted:  # subscribed before the old one lets go: no event published meanwhile goes nowhere
                wanted[name].attach(self.bus)  # the old channel gets nothing more: what it holds is final
                wanted[name].take_over(old)  # its backlog and its counters: nothing lost, no counter goes back
                self.sinks[name] = wanted[name]
            self._sink_handles()
            old.close()  # a removed sink counts what it still held (the webhook: events not spooled)
            if name in wanted:
                await sup.start(
                    name, wanted[name].serve, critical=wanted[name].critical, fingerprint=wanted[name].fingerprint()
                )
        for name, sink in wanted.items():
            if name in self.sinks:
                continue  # an identical one is running, or its replacement was started above
            sink.attach(self.bus)
            self.sinks[name] = sink
            self._sink_handles()
            await sup.start(name, sink.serve, critical=sink.critical, fingerprint=sink.fingerprint())

    async def reload(self) -> None:
        """Re-read the config and apply it, or keep the running one (``reloading.Reloads``: a failure while applying
        rolls back to the running config). Never raises (``trio.Cancelled`` aside). A rejected reload is logged and
        counted (``nodevitals_config_reloads_total{result="rejected"}``, ``nodevitals_config_last_reload_successful``
        0)."""
        steps = ReloadSteps(
            prepare=self._prepare_reload,
            running=lambda: (self.loaded, self.rules),
            install=self._install,
            persist=lambda strict: self.persist_engine(strict=strict),
            sync_tasks=self._sync_tasks,
        )
        await self.reloading.reload(steps)

    async def _prepare_reload(self) -> tuple[LoadedConfig, Rules]:
        """The new config checked (``reloading.prepare_reload``), and its listen address, when new, bound."""
        new, rules = await prepare_reload(self.config_path, self.host_root, self.loaded, self.engine)
        if self.supervisor is not None:  # held from here: no other process can take it meanwhile
            running, c = self.loaded.config.sinks.metrics.listen_addr, new.config
            self.http.reserve(self.supervisor, running, c.sinks.metrics.listen_addr, c.server.header_timeout_seconds)
        return new, rules

    def _install(self, loaded: LoadedConfig, rules: Rules) -> None:
        """Put ``loaded`` and its ``rules`` in force; conditions of rules they no longer have EXIT."""
        self.loaded, self.rules = loaded, rules
        self.kernel_rules = kmsg_service.compiled_rules(loaded.config)
        kmsg_service.configure_ledger(self.xids, loaded.config.kernel_log)
        self.emit(self._retire())

    def _retire(self) -> list[Event]:
        """EXIT the conditions whose rule is gone (threshold rules, and kernel-log rules while that source is on)."""
        kept = kmsg_service.live_keys(self.loaded.config, self.kernel_rules)
        return engine.retire_rules(
            self.engine, self.rules, node=self.node, now=time.time(), new_id=new_event_id, also_live=kept
        )

    async def _sync_tasks(self) -> None:
        """Restart the tasks whose config differs from ``self.loaded``; start and stop sinks and tiers to match."""
        sup = self.supervisor
        assert sup is not None
        await self.sync_sinks()
        wanted = {f"tier:{t}": t for t in self.active_tiers()}
        for name in [n for n in sup.states() if n.startswith("tier:") and n not in wanted]:
            await sup.stop(name)
            self.snapshots.pop(name.removeprefix("tier:"), None)
            self.heartbeats.pop(name.removeprefix("tier:"), None)
            self.ticks.pop(name.removeprefix("tier:"), None)
        for name, tier in wanted.items():
            running = sup.get(name)
            if running is None or running.fingerprint != self.tier_fingerprint(tier):
                await sup.start(name, serve_tier, self, tier, critical=True, fingerprint=self.tier_fingerprint(tier))
        await self.sync_podresources()  # GPU pod attribution: started, stopped or re-targeted with the config
        await self.sync_kmsg()  # the kernel-log source: started, stopped or restarted with its config
        await self.http.restart(sup, self.server_fingerprint())  # on the address the reload bound, if new

    async def start_http(self, socks: list[socket.socket] | None) -> None:
        """Start the HTTP server (on ``socks`` when given) over the agent as a read-only view, with the config
        values its fingerprint is made of, and record where it listens."""
        assert self.supervisor is not None
        await self.http.start(self.supervisor, self.server_fingerprint(), socks)

    async def watch_signals(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """SIGHUP asks the reloader for a reload (SIGHUPs during one make one more, not one each); SIGTERM/SIGINT
        stop the agent and cancel a reload in progress; a second one stops it now."""
        requests, pending = trio.open_memory_channel[None](1)
        reloader = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._reloader, pending, reloader)
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
                # The signal itself arms the exit guard (``nvdaemon run`` only), for the grace now in force.
                grace = lambda: self.loaded.config.shutdown_grace_seconds  # noqa: E731
                shutdown.arm_on_signals((signal.SIGTERM, signal.SIGINT), grace)
                task_status.started()
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        if not self.stopping.is_set():
                            log.info("SIGHUP: reloading config")
                            with contextlib.suppress(trio.WouldBlock):  # one is queued already: it reads the file
                                requests.send_nowait(None)
                        continue
                    if self.stopping.is_set():
                        log.warning("second %s: stopping now", signal.Signals(signum).name)
                        self.root_scope.cancel()
                        return
                    log.info("%s: shutting down", signal.Signals(signum).name)
                    self.stopping.set()
                    reloader.cancel()  # shutdown stops the tasks; a reload must not start them again

    async def _reloader(self, pending: trio.MemoryReceiveChannel[None], scope: trio.CancelScope) -> None:
        with scope:
            async for _ in pending:
                await self.started.wait()  # never alongside start_tasks, which starts the same tasks
                try:
                    await self.reload()
                except Exception as exc:  # reload() handles its own errors; this keeps a bug in it from the root
                    self.reloading.reject(exc)

    async def run(self) -> None:
        grace = self.loaded.config.shutdown_grace_seconds
        self.started_clock = trio.current_time()
        self.load_engine()
        # Before the first event: a block of seqs reserved in stateDir (a refusal is logged; events go on regardless).
        await self.store.reserve(self.engine)
        self.emit(self._retire())
        # NVML unusable: the gpu tier is skipped, or NvmlUnavailable when it is the only tier. The GPUs lost before a
        # restart come back with the engine state: still lost, no second ENTER; answering, their EXIT.
        gpu = await open_gpu(
            self.loaded.config.gpu,
            self.active_tiers(),
            node=self.node,
            emit=self.emit,
            next_seq=self.next_seq,
            lost=self.engine.lost_gpus,
            ledger=self.xids,
        )
        self.gpu, self.skipped_tiers = gpu.runtime, self.skipped_tiers | gpu.skipped_tiers
        async with trio.open_nursery() as root:
            self.root_scope = root.cancel_scope
            self.supervisor = sup = Supervisor(root)
            await root.start(self.watch_signals)
            await self.start_tasks()
            self.ready = True
            self.started.set()
            self.after_start()
            log.info("ready: node=%s tiers=%s listening on %s", self.node, ",".join(self.active_tiers()), self.bound)
            await self.stopping.wait()
            await self._shut_down(sup, grace)
            root.cancel_scope.cancel()
        log.info("stopped")

    async def _shut_down(self, sup: Supervisor, grace: float) -> None:
        """Stop everything by one deadline, ``shutdownGraceSeconds`` from now (the root scope's too). The tasks'
        own shielded cleanup (a sink's final flush, the GPU close: ``shutdown.bounded_shield``) ends by the first
        ``1 - FINAL_SHARE`` of it; the final persist and the HTTP stop, in a ``finally`` so that no overrun before
        them skips them, have the rest. Each step is also bounded by its own budget. The HTTP server drains from the
        start, side by side with the rest (it stops accepting and closes idle keep-alive connections now; requests in
        progress and the event streams, which the stream sink closes with 1001, get its graceful timeout); where a
        worker thread keeps trio from returning, the exit guard (``shutdown.EXIT_GUARD``) ends the process."""
        began = trio.current_time()
        deadline = began + grace
        self.root_scope.deadline = deadline
        shutdown.set_deadline(deadline - grace * FINAL_SHARE)
        sup.stopping = True
        self.http_shutdown.set()  # clients busy on keep-alive no longer take the loop from the shutdown
        stop_phase = trio.move_on_at(shutdown.deadline())  # a task still cleaning up then is left to its nursery
        try:
            with stop_phase:
                # Producers first, then consumers: the tier loops stop publishing before the sinks flush and stop.
                await _stop_all(sup, [n for n in sup.states() if n.startswith(("tier:", "source:"))])
                opened, self.gpu = self.gpu, None
                await close_gpu(opened)  # the XID wait has returned and its event set is freed: nvmlShutdown
                await _stop_all(sup, [n for n in sup.states() if n != "http"])  # the sinks: side by side, not in turn
        finally:
            # Where a slow shutdown spent its time: the tasks' share, or the persist and HTTP stop that follow.
            log.info(
                "shutdown: tiers and sinks %s in %.2fs; final persist and HTTP stop next",
                "cut short at their share of the deadline" if stop_phase.cancelled_caught else "stopped",
                trio.current_time() - began,
            )
            shutdown.set_deadline(deadline)
            with shutdown.bounded_shield(max(grace / 2, 0.5)):
                self.store.mark_dirty()
                await self.persist_engine()
            for sink in self.sinks.values():  # what a sink could not make durable is dropped, counted and logged
                sink.close()
            await self.http.stop(sup)  # a server in its restart backoff is cancelled, not waited for


async def _stop_all(sup: Supervisor, names: list[str]) -> None:
    """Stop the tasks ``names`` at the same time; return once all of them have finished their cleanup."""
    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(sup.stop, name)


def tier_collectors(config: Config, tier: str, gpu: GpuRuntime | None = None) -> list[Collector]:
    """The collectors a tier runs, configured: the gpu tier's from the open GPU runtime, the core tier's with the
    node_exporter drop-in's (nodeExporter.enabled runs its collectors in the core tier)."""
    collectors = gpu.collectors() if gpu is not None else collectors_for_tier(tier)
    if tier == "core":
        collectors += node_exporter_collectors(config, NODE_EXPORTER_TABLE)
    for collector in collectors:
        collector.configure(config)
    return collectors


async def tick(
    agent: Agent, tier: str, runners: list[CollectorRunner], read_timeout: float, worker: ReusableThread
) -> None:
    """One tick of ``tier``: collect, then evaluate and publish the snapshot (``Agent.on_snapshot``), with automatic
    garbage collection paused throughout (``nvdaemon.gcpause``): a core tick's objects are freed by reference
    counting once its snapshot replaces the last one, so none is left for a collection walk to find. Bounded by
    ``read_timeout``: the collection gives up on a hung read at its deadline."""
    with gcpause.paused():
        agent.on_snapshot(await collect_tier(tier, runners, agent.roots, read_timeout, worker))


async def serve_tier(agent: Agent, tier: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Collect ``tier`` every interval at a fixed rate (missed ticks are skipped, not bunched up)."""
    config = agent.loaded.config
    gpu = agent.gpu if tier == "gpu" else None  # NVML calls run under the GPU runtime's own limiter
    limiter = gpu.limiter if gpu is not None else trio.CapacityLimiter(4)
    collectors = tier_collectors(config, tier, gpu)
    runners = [CollectorRunner(c, limiter) for c in collectors]
    worker = ReusableThread(f"tier {tier}")  # the same thread every tick while it is free (nvdaemon.worker_thread)
    interval = agent.interval(tier)
    next_tick = trio.current_time()
    first = True
    while True:
        await tick(agent, tier, runners, config.collector_timeout_seconds, worker)
        # Liveness: the loop collected and evaluated. Saving engine state may wait for the webhook spool (up to
        # DURABLE_WAIT_SECONDS, e.g. while a reload replaces an endpoint); that wait is the loop running, not stuck,
        # and a loop stuck in it for good stops recording heartbeats all the same.
        agent.heartbeats[tier] = trio.current_time()
        await agent.persist_engine()
        agent.ticks[tier] = agent.ticks.get(tier, 0) + 1
        if first:
            first = False
            task_status.started()
        next_tick += interval
        now = trio.current_time()
        next_tick = max(next_tick, now)
        await trio.sleep_until(next_tick)
