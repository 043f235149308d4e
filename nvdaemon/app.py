"""The agent: the root nursery, what every task shares, start, reload and shutdown.

Start: load engine state from stateDir, start the HTTP server (ready when bound), then each tier loop (ready after
its first tick); ``/readyz`` turns 200 when all of them have started. SIGHUP reloads the config (``Agent.reload``):
a config that cannot be read, validated or applied is logged and counted and the running one kept, and only tasks
whose config changed are restarted. Reloads run in their own task, so no error of theirs reaches the root nursery
and a SIGTERM is answered while one is in progress. SIGTERM/SIGINT: the tier loops are cancelled, engine state is
flushed under a shielded deadline, hypercorn is stopped through its shutdown trigger, and the process exits 0
within ``shutdownGraceSeconds``. A second signal cuts the grace period short.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import signal
import socket
import time
from collections.abc import Hashable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from nvdaemon import engine, shutdown
from nvdaemon.bus import EventBus
from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import HostRoots
from nvdaemon.compat.node_exporter import TABLE as NODE_EXPORTER_TABLE
from nvdaemon.compat.node_exporter.surface import node_exporter_collectors
from nvdaemon.config import ConfigError, LoadedConfig, ServerConfig
from nvdaemon.gpu import GpuRuntime, close_gpu, open_gpu, podresources
from nvdaemon.gpu.xid import TASK_NAME as XID_TASK
from nvdaemon.gpu.xid import serve_xid
from nvdaemon.history.service import HistorySink
from nvdaemon.model import Event, new_event_id
from nvdaemon.reloading import Rules, prepare_reload
from nvdaemon.seqmark import MARK_FILE, SeqMark
from nvdaemon.server.app import Listening, serve_http
from nvdaemon.sinks import Durable, Sink, SinkContext, SnapshotConsumer, build_sinks
from nvdaemon.statefile import atomic_write, quarantine
from nvdaemon.supervise import Supervisor, TaskState, describe
from nvdaemon.tiers import CollectorRunner, TierSnapshot, collect_tier
from nvdaemon.view import AgentView, EventKey, Surfaces

if TYPE_CHECKING:
    from nvdaemon.sinks.stream import StreamHub

log = logging.getLogger(__name__)
events_log = logging.getLogger("nvdaemon.events")

ENGINE_FILE = "engine.json"
DURABLE_WAIT_SECONDS = 1.0
HTTP_STOP_SECONDS = 10.0  # a replaced HTTP server's graceful stop (hypercorn's own is at most 5 s), then cancelled
FINAL_SHARE = 0.25  # of shutdownGraceSeconds, kept for the final engine-state persist and the HTTP stop


class Agent:
    """Everything the tasks share. Only touched from the trio thread, so no locks beyond the persist lock."""

    def __init__(self, loaded: LoadedConfig, config_path: str | None = None, host_root: Path | None = None) -> None:
        self.loaded = loaded
        self.config_path = config_path
        self.host_root = host_root
        self.bus = EventBus()
        self.engine = engine.EngineState()
        self.rules = engine.compile_rules(loaded.config.rules)
        self.snapshots: dict[str, TierSnapshot] = {}
        self.gpu: GpuRuntime | None = None  # opened NVML (nvdaemon/gpu), when the gpu tier is configured and usable
        self.skipped_tiers: set[str] = set()  # configured but unusable on this node (gpu without NVML)
        self.sinks: dict[str, Sink] = {}
        self.history: HistorySink | None = None  # the history sink, when running (set by sync_sinks)
        self.stream: StreamHub | None = None  # the websocket hub, when running (set by sync_sinks)
        self.snapshot_version = 0
        self.heartbeats: dict[str, float] = {}  # trio clock of each tier's last completed tick
        self.ticks: dict[str, int] = {}  # completed ticks of each tier since the start (/healthz, /v1/status)
        self.event_counts: collections.Counter[EventKey] = collections.Counter()
        self.started_at = time.time()
        self.started_clock = 0.0
        self.ready = False
        self.started = trio.Event()  # the start sequence is done: a SIGHUP before it waits for it
        self.stopping = trio.Event()
        self.http_shutdown = trio.Event()
        self.bound: list[str] = []
        self.http_sockets: list[socket.socket] = []  # the running HTTP server's listening sockets
        self._reserved_http: list[socket.socket] | None = None  # a reload's new listenAddr, bound (bind_for)
        self.supervisor: Supervisor | None = None
        self.reloads = 0
        self.changes = 0  # bumped by anything that changes what /metrics shows besides snapshots and events
        self.reload_failures = 0
        self.last_reload_ok = True
        self.root_scope = trio.CancelScope()
        self._persist_lock = trio.Lock()
        self._engine_dirty = False
        self._saved_seq = -1  # the event seq of the engine state last written to stateDir
        self.seqmark = SeqMark()  # event seqs are issued only under a mark saved in stateDir (seqmark.py)
        self._durable_warned = False
        self.engine_save_error: str | None = None  # why the last engine.json write failed (a full stateDir)

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
    def tasks(self) -> dict[str, TaskState]:
        return self.supervisor.tasks if self.supervisor is not None else {}

    @property
    def surfaces(self) -> Surfaces:
        c = self.loaded.config
        return Surfaces(c.dcgm_compat.enabled, c.smartctl_compat.enabled, c.node_exporter.enabled)

    # ---- engine ---------------------------------------------------------------------------------------------
    @property
    def engine_path(self) -> Path:
        return self.loaded.state_dir / ENGINE_FILE

    @property
    def seqmark_path(self) -> Path:
        return self.loaded.state_dir / MARK_FILE

    def load_engine(self) -> None:
        """Restore the event seq, the active rule conditions and the lost GPUs from ``engine.json``, and the seq's
        durable mark from ``seqmark.json`` (the seq continues from the greater of the two); a damaged file is moved
        aside, never a crash loop. Until ``seqmark.reserve`` has saved a new mark, seqs issued count as
        unreserved."""
        path = self.engine_path
        try:
            data: bytes | None = path.read_bytes()
        except FileNotFoundError:
            data = None
        if data is not None:
            try:
                self.engine = engine.load_state(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                quarantine(path, str(exc))
            else:
                log.info(
                    "restored %d active condition(s) (%d rule, %d lost GPU), event seq %d",
                    len(self.engine.active) + len(self.engine.lost_gpus),
                    len(self.engine.active),
                    len(self.engine.lost_gpus),
                    self.engine.seq,
                )
        self.seqmark.load(self.engine, self.seqmark_path)
        # Seqs up to here were published by the run before: a durable sink attached now has none of them to commit.
        self.bus.last_seq = max(self.bus.last_seq, self.engine.seq)

    async def persist_engine(self, *, strict: bool = False) -> None:
        """Save active conditions and the event seq, but only once every durable sink (the webhook spool) holds
        the events that led there: saved state with an unspooled ENTER would lose that ENTER to a crash, while
        unsaved state only makes a restart detect the transition again (at-least-once). A durable sink whose spool
        refuses writes holds its ``committed_seq`` back, so nothing is saved past what it holds only in memory. A
        write stateDir refuses is logged (once per streak) and retried on the next call; it is raised (OSError) only
        when ``strict``: a reload applying a config rolls back on it. First, every call keeps the event seq's durable
        mark ahead of the seqs issued (``seqmark.py``; a write only once half of its block is used)."""
        await self.seqmark.keep_ahead(self.engine, self.seqmark_path)
        if not self._engine_dirty:
            return
        target = self.engine.seq
        # The state that goes with seq `target`, taken now: another tier, an XID or a reload may emit while we
        # wait, and a dump taken after the wait would record transitions the spool may not hold yet.
        data = engine.dump_state(self.engine)
        with trio.move_on_after(DURABLE_WAIT_SECONDS) as waited:
            for sink in [s for s in self.sinks.values() if isinstance(s, Durable)]:
                await sink.wait_committed(target)
        if waited.cancelled_caught:
            lagging = [s.name for s in self.sinks.values() if isinstance(s, Durable) and s.committed_seq < target]
            if not self._durable_warned:
                log.warning("engine state not saved yet: events up to seq %d not yet spooled by %s", target, lagging)
            self._durable_warned = True
            return
        self._durable_warned = False
        async with self._persist_lock:
            if target < self._saved_seq:  # a concurrent call already saved a newer state
                return
            try:
                await trio.to_thread.run_sync(atomic_write, self.engine_path, data)
            except OSError as exc:
                # A full or read-only stateDir: the old file stays (at-least-once: a restart detects the newer
                # transitions again); the state stays dirty and the next tick tries again. Never a tier crash.
                if self.engine_save_error is None:
                    log.error("engine state not saved (%s); retried every tick", exc.strerror or exc)
                self.engine_save_error = exc.strerror or str(exc)
                if strict:
                    raise
                return
            if self.engine_save_error is not None:
                log.info("engine state saved again")
                self.engine_save_error = None
            self._saved_seq = target
            if self.engine.seq == target:  # else events came while waiting: their state is saved next time
                self._engine_dirty = False

    def emit(self, events: list[Event]) -> None:
        for ev in events:
            self._engine_dirty = True
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
        running = sup.tasks.get(podresources.TASK_NAME)
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
        )

    def _sink_handles(self) -> None:
        """The typed handles on the sinks other parts call into (snapshots to history, the websocket routes)."""
        history = self.sinks.get("history")
        self.history = history if isinstance(history, HistorySink) else None
        self.stream = None
        if "stream" in self.sinks:
            from nvdaemon.sinks.stream import StreamHub  # loaded already: the hub was built from it

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
        """Re-read the config and apply it, or keep the running one. Never raises (``trio.Cancelled`` aside).

        What can fail is tried before anything changes (``reloading.prepare_reload``: the file, the host checks, the
        rules, and a trial state write when rules are retired). A failure while applying after all (a sink that
        cannot be built, the engine state the disk refuses after the trial, the server's restart) rolls back to the
        running config: its rules, sinks, tier loops and server. A rejected reload is logged and counted
        (``nodevitals_config_reloads_total{result="rejected"}``, ``nodevitals_config_last_reload_successful`` 0).
        """
        try:
            new, rules = await prepare_reload(self.config_path, self.host_root, self.loaded, self.engine)
            self._reserved_http = self.bind_for(new)  # held from here: no other process can take it meanwhile
        except Exception as exc:
            self._reload_rejected(exc)
            return
        running, running_rules = self.loaded, self.rules
        try:
            await self._apply_config(new, rules)
        except Exception as exc:
            self._reload_rejected(exc, applied=True)
            await self._roll_back(running, running_rules)
            return
        self.reloads += 1
        self.last_reload_ok = True
        log.info("config reloaded from %s", new.source)

    def _reload_rejected(self, exc: BaseException, applied: bool = False) -> None:
        self.reload_failures += 1
        self.last_reload_ok = False
        self.changes += 1  # /metrics shows the count
        if isinstance(exc, ConfigError):
            log.error("reload rejected, keeping the running config:\n%s", exc)
            return
        stage = "while applying it, rolling back" if applied else "keeping the running config"
        # An OSError explains itself; anything else is a bug worth its traceback.
        trace = None if isinstance(exc, OSError) else exc
        log.error("reload failed %s: %s", stage, describe(exc), exc_info=trace)

    async def _roll_back(self, loaded: LoadedConfig, rules: Rules) -> None:
        """Back to the running config after a failed apply; conditions the rejected rules entered meanwhile EXIT."""
        self.loaded, self.rules = loaded, rules
        self.emit(engine.retire_rules(self.engine, self.rules, node=self.node, now=time.time(), new_id=new_event_id))
        for step in (self._sync_tasks, self.persist_engine):
            try:
                await step()
            except Exception as exc:  # the supervisor keeps retrying what did not start; state is saved next tick
                log.error("rollback: %s failed: %s", step.__name__.strip("_"), describe(exc))

    async def _apply_config(self, new: LoadedConfig, rules: Rules) -> None:
        self.loaded = new
        self.rules = rules
        self.emit(engine.retire_rules(self.engine, self.rules, node=self.node, now=time.time(), new_id=new_event_id))
        await self.persist_engine(strict=True)
        await self._sync_tasks()

    async def _sync_tasks(self) -> None:
        """Restart the tasks whose config differs from ``self.loaded``; start and stop sinks and tiers to match."""
        sup = self.supervisor
        assert sup is not None
        await self.sync_sinks()
        wanted = {f"tier:{t}": t for t in self.active_tiers()}
        for name in [n for n in sup.tasks if n.startswith("tier:") and n not in wanted]:
            await sup.stop(name)
            self.snapshots.pop(name.removeprefix("tier:"), None)
            self.heartbeats.pop(name.removeprefix("tier:"), None)
            self.ticks.pop(name.removeprefix("tier:"), None)
        for name, tier in wanted.items():
            running = sup.tasks.get(name)
            if running is None or running.fingerprint != self.tier_fingerprint(tier):
                await sup.start(name, serve_tier, self, tier, critical=True, fingerprint=self.tier_fingerprint(tier))
        await self.sync_podresources()  # GPU pod attribution: started, stopped or re-targeted with the config
        await self.restart_http(self._take_reserved_http())

    def _take_reserved_http(self) -> list[socket.socket] | None:
        socks, self._reserved_http = self._reserved_http, None
        return socks

    def bind_for(self, new: LoadedConfig) -> list[socket.socket] | None:
        """Sockets bound (not yet listening) to ``new``'s listenAddr when it differs from the running server's,
        before anything of ``new`` is applied: an address that cannot be had rejects the reload and the old server
        stays (OSError). None when the address is unchanged (a restarted server takes over the running one's
        sockets), or when the new address overlaps the running one's port (``127.0.0.1:P`` -> ``:P``): the kernel
        refuses that bind while the old listener exists, so that server is stopped first (``restart_http``).
        Sockets that are never handed to a server are closed when dropped (a reload rejected later)."""
        from nvdaemon.server import listen

        old = self.loaded.config.sinks.metrics.listen_addr
        addr = new.config.sinks.metrics.listen_addr
        if self.supervisor is None or "http" not in self.supervisor.tasks or addr == old:
            return None
        timeout_ms = listen.user_timeout_ms(new.config.server.header_timeout_seconds)
        try:
            return listen.bind(addr, user_timeout_ms=timeout_ms, backlog=None)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE and listen.overlaps(old, addr):
                return None
            raise

    async def restart_http(self, socks: list[socket.socket] | None) -> None:
        """Restart the HTTP server if its settings changed: the new one is listening (on ``socks``, or on dups of
        the running server's sockets when the address is unchanged) before the old one is told to stop, so no
        connection is refused meanwhile; the old one then finishes its requests within its graceful timeout.
        Only a new address overlapping the old port makes the old server stop first (``bind_for``)."""
        sup = self.supervisor
        assert sup is not None
        http = sup.tasks.get("http")
        if http is None or http.fingerprint == self.server_fingerprint():
            for sock in socks or []:
                sock.close()
            return
        self._record_http(http.started_value)  # its latest run's sockets (the supervisor may have restarted it)
        running_addr = http.fingerprint[0] if isinstance(http.fingerprint, tuple) else None
        same_addr = running_addr == self.loaded.config.sinks.metrics.listen_addr
        if socks is None and same_addr and all(sock.fileno() != -1 for sock in self.http_sockets):
            socks = [sock.dup() for sock in self.http_sockets]
        old_shutdown, self.http_shutdown = self.http_shutdown, trio.Event()
        if socks is None:  # the new address needs the old listener gone first
            await self._stop_http(http, old_shutdown)
        del sup.tasks["http"]  # kept running until the new one listens: Supervisor.start would cancel it first
        await self.start_http(socks)
        await self._stop_http(http, old_shutdown)

    async def start_http(self, socks: list[socket.socket] | None) -> None:
        """Start the HTTP server (on ``socks`` when given) over the agent as a read-only view, with the config
        values its fingerprint is made of, and record where it listens."""
        sup = self.supervisor
        assert sup is not None
        view: AgentView = self  # the server reads the agent only through this (mypy checks that the agent fits)
        fingerprint = addr, server, grace = self.server_fingerprint()
        serve = partial(
            serve_http,
            view,
            server,
            addr,
            shutdown_grace_seconds=grace,
            shutdown_trigger=self.http_shutdown.wait,
            sockets=socks,
        )
        self._record_http(await sup.start("http", serve, critical=True, fingerprint=fingerprint))

    def _record_http(self, listening: object) -> None:
        """Where the HTTP server listens, as it reported when it started (nothing when that start failed)."""
        if isinstance(listening, Listening):
            self.bound, self.http_sockets = list(listening.bound), list(listening.sockets)

    @staticmethod
    async def _stop_http(http: TaskState, shutdown: trio.Event) -> None:
        """A running server stops gracefully (its shutdown trigger); one in backoff, or one that overruns its
        graceful timeout, is cancelled."""
        if http.state == "running":
            shutdown.set()
            with trio.move_on_after(HTTP_STOP_SECONDS):
                await http.done.wait()
        http.scope.cancel()
        await http.done.wait()

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
                    self._reload_rejected(exc)

    async def run(self) -> None:
        grace = self.loaded.config.shutdown_grace_seconds
        self.started_clock = trio.current_time()
        self.load_engine()
        # Before the first event: a block of seqs reserved in stateDir (a refusal is logged; events go on regardless).
        await self.seqmark.reserve(self.engine, self.seqmark_path)
        self.emit(engine.retire_rules(self.engine, self.rules, node=self.node, now=time.time(), new_id=new_event_id))
        # NVML unusable: the gpu tier is skipped, or NvmlUnavailable when it is the only tier. The GPUs lost before a
        # restart come back with the engine state: still lost, no second ENTER; answering, their EXIT.
        gpu = await open_gpu(
            self.loaded.config.gpu,
            self.active_tiers(),
            node=self.node,
            emit=self.emit,
            next_seq=self.next_seq,
            lost=self.engine.lost_gpus,
        )
        self.gpu, self.skipped_tiers = gpu.runtime, self.skipped_tiers | gpu.skipped_tiers
        async with trio.open_nursery() as root:
            self.root_scope = root.cancel_scope
            self.supervisor = sup = Supervisor(root)
            await root.start(self.watch_signals)
            await self.start_tasks()
            self.ready = True
            self.started.set()
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
                await _stop_all(sup, [n for n in sup.tasks if n.startswith(("tier:", "source:"))])
                opened, self.gpu = self.gpu, None
                await close_gpu(opened)  # the XID wait has returned and its event set is freed: nvmlShutdown
                await _stop_all(sup, [n for n in sup.tasks if n != "http"])  # the sinks: side by side, not in turn
        finally:
            # Where a slow shutdown spent its time: the tasks' share, or the persist and HTTP stop that follow.
            log.info(
                "shutdown: tiers and sinks %s in %.2fs; final persist and HTTP stop next",
                "cut short at their share of the deadline" if stop_phase.cancelled_caught else "stopped",
                trio.current_time() - began,
            )
            shutdown.set_deadline(deadline)
            with shutdown.bounded_shield(max(grace / 2, 0.5)):
                self._engine_dirty = True
                await self.persist_engine()
            for sink in self.sinks.values():  # what a sink could not make durable is dropped, counted and logged
                sink.close()
            http = sup.tasks.get("http")
            if http is not None:  # a server in its restart backoff is cancelled, not waited for
                with shutdown.bounded_shield(HTTP_STOP_SECONDS):
                    await self._stop_http(http, self.http_shutdown)


async def _stop_all(sup: Supervisor, names: list[str]) -> None:
    """Stop the tasks ``names`` at the same time; return once all of them have finished their cleanup."""
    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(sup.stop, name)


async def serve_tier(agent: Agent, tier: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Collect ``tier`` every interval at a fixed rate (missed ticks are skipped, not bunched up)."""
    config = agent.loaded.config
    gpu = agent.gpu if tier == "gpu" else None  # NVML calls run under the GPU runtime's own limiter
    limiter = gpu.limiter if gpu is not None else trio.CapacityLimiter(4)
    collectors = gpu.collectors() if gpu is not None else collectors_for_tier(tier)
    if tier == "core":  # the node_exporter drop-in (nodeExporter.enabled) runs its collectors in the core tier
        collectors += node_exporter_collectors(config, NODE_EXPORTER_TABLE)
    for collector in collectors:
        collector.configure(config)
    runners = [CollectorRunner(c, limiter) for c in collectors]
    interval = agent.interval(tier)
    roots = agent.roots
    next_tick = trio.current_time()
    first = True
    while True:
        snap = await collect_tier(tier, runners, roots, config.collector_timeout_seconds)
        agent.on_snapshot(snap)
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
