"""The kernel-log source: the supervised task ``source:kmsg`` reading ``<devRoot>/kmsg`` (``reader.py``), matching
each record (``gpu_lines.py``, ``rules.py``) and turning matches into events (``faults.py``, the XID ledger).

Start: the saved position (``position.py``) and the boot id (``/proc/sys/kernel/random/boot_id``) decide what to
read. Same boot: every record after the last one seen (none twice; a gap in the seqs, records the ring buffer
dropped meanwhile, is counted as lost). A new boot: the kernel-log conditions of the last boot EXIT (``faults``) and
its XID folds end, then records at most ``lookbackSeconds`` old (by ``/proc/uptime``) are read; the same on a first
start. A node without the file reports the source absent; one that refuses it (no CAP_SYSLOG, a device cgroup)
reports it unreadable and tries again every ``REOPEN_SECONDS``; neither is a failure of the agent.

Per record: the header is parsed; a record a process wrote (a facility other than the kernel's) is skipped; the
message is tested with one ``in`` per literal (the GPU driver's prefixes and each rule's); only a message that passes
is decoded and tried against regular expressions, at most ``maxRecordsPerSecond`` a second for the GPU driver's lines
and as many for the host rules' (the rest are counted as skipped: a storm costs reads, not parses, and a storm of one
kind leaves the other's budget alone). A message seen lately gets the answer it got then without a parse (``RECENT``):
a storm of one repeated line is nearly free.

The position is saved at most every ``SAVE_SECONDS`` and at the end, and only after the engine state was saved and
every durable sink holds the events of the records read (``held_seq``).
"""

from __future__ import annotations

import collections
import logging
import math
import os
import stat
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from nvdaemon.config import KernelLogConfig
from nvdaemon.engine import EngineState
from nvdaemon.gpu.xid_ledger import XidLedger, pci_key
from nvdaemon.kmsg.faults import KernelFaults
from nvdaemon.kmsg.gpu_lines import PREFILTER, FallenOffLines, GpuLine, parse_gpu_line
from nvdaemon.kmsg.position import KmsgPosition, dump_position, load_position
from nvdaemon.kmsg.reader import KmsgReader
from nvdaemon.kmsg.record import BadRecord, parse_record, unescape
from nvdaemon.kmsg.rules import NODE_DEVICE, CompiledKernelRule
from nvdaemon.model import Event
from nvdaemon.sinks.spool_clock import read_boot_id
from nvdaemon.statefile import atomic_write

if TYPE_CHECKING:
    from nvdaemon.gpu import GpuRuntime

log = logging.getLogger(__name__)

TASK_NAME = "source:kmsg"  # "source:" tasks stop with the tier loops, before the sinks flush
BATCH = 512  # records read between two checkpoints of the loop
SAVE_SECONDS = 1.0
REOPEN_SECONDS = 60.0
RECENT = 256  # messages whose answer is remembered


class KmsgCounters:
    def __init__(self) -> None:
        self.read = 0
        self.parsed = 0
        self.matches: collections.Counter[str] = collections.Counter()
        self.lost = 0
        self.skipped: collections.Counter[str] = collections.Counter()
        self.truncated = 0


Outcome = tuple[GpuLine | None, list[tuple[CompiledKernelRule, str, dict[str, str | None]]]]


class KmsgSource:
    """One run of the source. ``state()`` is the engine state (conditions, seq); ``emit`` publishes events;
    ``persist_engine`` saves the engine state; ``held_seq()`` is the seq every durable sink holds (math.inf: none
    runs); ``clock`` the wall clock (tests pass one that follows trio's)."""

    def __init__(
        self,
        cfg: KernelLogConfig,
        rules: list[CompiledKernelRule],
        *,
        path: Path,
        position_path: Path,
        boot_id_path: Path,
        uptime_path: Path,
        node: str,
        state: Callable[[], EngineState],
        emit: Callable[[list[Event]], None],
        ledger: XidLedger,
        persist_engine: Callable[[], Awaitable[None]],
        held_seq: Callable[[], float],
        gpu: GpuRuntime | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.rules = rules
        self.by_key = {cr.key: cr for cr in rules if cr.rule.mode == "condition"}
        self.path = path
        self.position_path = position_path
        self.boot_id_path = boot_id_path
        self.uptime_path = uptime_path
        self.state = state
        self.emit = emit
        self.ledger = ledger
        self.persist_engine = persist_engine
        self.held_seq = held_seq
        self.gpu = gpu
        self.clock = clock
        self.faults = KernelFaults(node)
        self.counters = KmsgCounters()
        self.reader = KmsgReader(path)
        self.up = False
        self.problem = ""  # why it is not reading: "" while it reads
        self.present = True
        self.boot_id = ""
        self.last_seq = -1  # the last record read
        self.skip_through = -1  # records up to this seq were read before a restart
        self.lookback_from: float | None = None  # seconds since boot: older records are not read
        self.boot_wall: float | None = None  # wall time of the boot (from /proc/uptime)
        self._fallen = FallenOffLines()
        self._recent: dict[bytes, Outcome] = {}
        # Two budgets: GPU driver lines and host-rule lines, so a storm of one kind cannot starve the other.
        self._window_start = -math.inf
        self._budget = {True: 0, False: 0}
        self._emitted_seq = 0  # the seq of the last event this source published
        self._saved: tuple[int, str] = (-2, "")
        self._rearm = trio.Event()
        self.ledger.armed = self._arm

    # ---- status --------------------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        c = self.counters
        return {
            "path": str(self.path),
            "up": self.up,
            "present": self.present,
            "problem": self.problem,
            "bootId": self.boot_id,
            "lastSeq": self.last_seq,
            "recordsRead": c.read,
            "recordsParsed": c.parsed,
            "matches": dict(c.matches),
            "overruns": self.reader.overruns,
            "recordsLost": c.lost,
            "skipped": dict(c.skipped),
            "rules": len(self.rules),
            "xidFolds": len(self.ledger.folds()),
        }

    # ---- the task ------------------------------------------------------------------------------------------------
    async def serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        pos = await trio.to_thread.run_sync(load_position, self.position_path)
        self.boot_id = read_boot_id(self.boot_id_path) or ""
        self._begin(pos)
        started = False
        try:
            while True:
                if self._open():
                    break
                if not started:
                    started = True
                    task_status.started()
                await trio.sleep(REOPEN_SECONDS)
            self.ledger.live.add("kmsg")
            if not started:
                task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._timers)
                await self._read_loop()
        finally:
            self.ledger.live.discard("kmsg")
            self.up = False
            self.reader.close()
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                await self._save(final=True)

    def _begin(self, pos: KmsgPosition) -> None:
        """What to read, from the saved position and this boot's id."""
        uptime = _since_boot(self.path, self.uptime_path)
        now = self.clock()
        self.boot_wall = None if uptime is None else now - uptime
        if pos.boot_id and self.boot_id and pos.boot_id == self.boot_id and pos.seq >= 0:
            self.skip_through = self.last_seq = pos.seq
            self.ledger.restore(pos.xid_folds)
            for key, cond in self.state().active.items():
                if key[0].startswith("kmsg:"):
                    cond.stale = False  # not a series that reports every tick: nothing to go stale
            log.info("kmsg: reading the records after seq %d (same boot)", pos.seq)
            return
        if pos.boot_id and self.boot_id and pos.boot_id != self.boot_id:
            cleared = self.faults.reboot(self.state(), now)
            folds = self.ledger.forget_all()
            self._publish(cleared)
            log.info("kmsg: new boot: %d kernel-log condition(s) and %d XID fold(s) cleared", len(cleared), folds)
        if uptime is not None:
            self.lookback_from = uptime - self.cfg.lookback_seconds
        log.info("kmsg: reading the records of the last %gs", self.cfg.lookback_seconds)

    def _open(self) -> bool:
        try:
            self.reader.open()
        except FileNotFoundError:
            self.present, self.problem = False, f"{self.path} not present"
            return False
        except OSError as exc:
            why = f"{self.path} unreadable: {exc.strerror or exc}"
            if why != self.problem:
                hint = " (needs CAP_SYSLOG with kernel.dmesg_restrict=1)" if isinstance(exc, PermissionError) else ""
                log.warning("kmsg: %s%s; the kernel-log source is off until it can be opened", why, hint)
            self.present, self.problem = True, why
            return False
        self.present, self.problem, self.up = True, "", True
        log.info("kmsg: reading %s", self.path)
        return True

    async def _read_loop(self) -> None:
        """Read what there is, then wait for more; the position is saved at most every ``SAVE_SECONDS`` (each save
        is an fsync: a host logging a line a second must not cost one a second), and no later than that after the
        last record read."""
        last_save = -math.inf
        while True:
            n = 0
            for raw in self.reader.records(BATCH):
                n += 1
                self._record(raw)
            if self._unsaved() and trio.current_time() - last_save >= SAVE_SECONDS:
                await self._save()
                last_save = trio.current_time()
            if n == BATCH:
                await trio.lowlevel.checkpoint()
            elif self._unsaved():
                with trio.move_on_at(last_save + SAVE_SECONDS):
                    await self.reader.wait()
            else:
                await self.reader.wait()

    def _unsaved(self) -> bool:
        return (self.last_seq, self.boot_id) != self._saved

    async def _timers(self) -> None:
        """Send the XIDs whose merge window ended; EXIT the conditions gone quiet."""
        while True:
            deadlines = (self.ledger.next_deadline(), self.faults.next_deadline(self.state(), self.by_key))
            due = min((d for d in deadlines if d is not None), default=math.inf)
            self._rearm = trio.Event()
            with trio.move_on_after(max(0.0, due - self.clock()) if due < math.inf else math.inf):
                await self._rearm.wait()
            now = self.clock()
            self._note(self.ledger.due(now))  # published by the ledger; the position waits for them too
            self._publish(self.faults.due(self.state(), self.by_key, now))

    def _arm(self) -> None:
        self._rearm.set()

    # ---- one record ----------------------------------------------------------------------------------------------
    def _record(self, raw: bytes) -> None:
        c = self.counters
        c.read += 1
        try:
            rec = parse_record(raw, self.cfg.max_record_bytes)
        except BadRecord:
            c.skipped["malformed"] += 1
            return
        if rec.seq <= self.skip_through:
            c.skipped["seen"] += 1
            return
        if self.last_seq >= 0 and rec.seq > self.last_seq + 1:
            c.lost += rec.seq - self.last_seq - 1
        self.last_seq = max(self.last_seq, rec.seq)
        if self.lookback_from is not None and rec.usec / 1e6 < self.lookback_from:
            c.skipped["lookback"] += 1
            return
        if rec.facility != 0:
            # Not the kernel's: a record written to /dev/kmsg by a process (systemd, a container's `echo`) has a
            # facility other than 0, which the kernel refuses to let a writer set. A process must not be able to
            # fake an XID or a fallen-off GPU into a drain.
            c.skipped["userspace"] += 1
            return
        c.truncated += rec.truncated
        message = rec.message
        gpu_candidate = any(p in message for p in PREFILTER)
        candidates = [cr for cr in self.rules if not cr.literal or cr.literal in message]
        if not gpu_candidate and not candidates:
            return
        outcome = self._recent.pop(message, None)
        text = ""
        if outcome is not None:
            self._recent[message] = outcome  # most recently used last: eviction takes the oldest first
        else:
            now = trio.current_time()
            if now - self._window_start >= 1.0:
                per_second = self.cfg.max_records_per_second
                self._window_start, self._budget = now, {True: per_second, False: per_second}
            if self._budget[gpu_candidate] <= 0:
                c.skipped["budget"] += 1
                return
            self._budget[gpu_candidate] -= 1
            c.parsed += 1
            text = unescape(message)
            line = self._fallen.feed(text) if gpu_candidate else None
            if gpu_candidate and line is None:
                line = parse_gpu_line(text)
            found = [(cr, m) for cr in candidates if (m := cr.regex.search(text)) is not None]
            matches = [(cr, _device(cr, m.groupdict()), m.groupdict()) for cr, m in found]
            outcome = (line, matches)
            if line is None or line.kind != "fallen_off":  # the three-line form depends on the lines before
                if len(self._recent) >= RECENT:
                    del self._recent[next(iter(self._recent))]
                self._recent[message] = outcome
        self._apply(outcome, text or unescape(message), self._wall(rec.usec))

    def _apply(self, outcome: Outcome, text: str, at: float) -> None:
        line, matches = outcome
        state = self.state()
        events: list[Event] = []
        if line is not None:
            events += self._gpu_line(line, text, at)
        for cr, device, groups in matches:
            self.counters.matches[cr.rule.condition] += 1
            events += self.faults.on_rule(state, cr, device, groups, text, at)
            if cr.rule.mode == "condition":
                self._arm()
        self._publish(events)

    def _gpu_line(self, line: GpuLine, text: str, at: float) -> list[Event]:
        c, state = self.counters, self.state()
        if line.kind == "xid":
            c.matches["xid"] += 1
            sub = _subcode(line)
            self._note(self.ledger.report("kmsg", line.code, at, pci=line.pci, message=text, subcode=sub))
            return []
        if line.kind == "sxid":
            c.matches["sxid"] += 1
            return self.faults.on_sxid(state, line, text, at)
        if line.kind == "fallen_off":
            c.matches["gpu_fallen_off"] += 1
            ident = self.gpu.identity_by_pci(line.pci) if self.gpu is not None else None
            if self.gpu is not None and ident is not None:
                self.gpu.set_lost(ident, True, at, error="kernel log: GPU has fallen off the bus")
                return []
            return self.faults.on_fallen_off(state, line.pci, text, at)
        c.matches["gpu_recovered"] += 1
        self._note(self.ledger.recover(at, pci=line.pci, uuid=line.uuid, signal=line.signal))
        return self.faults.on_gpu_up(state, pci_key, line.pci, at) if line.pci else []

    def _publish(self, events: list[Event]) -> None:
        if events:
            self.emit(events)
            self._note(events)

    def _note(self, events: list[Event]) -> None:
        for ev in events:
            self._emitted_seq = max(self._emitted_seq, ev.seq)

    def _wall(self, usec: int) -> float:
        now = self.clock()
        return now if self.boot_wall is None else min(now, self.boot_wall + usec / 1e6)

    # ---- position ------------------------------------------------------------------------------------------------
    async def _save(self, final: bool = False) -> None:
        """Save the position once the events of the records read are held (engine state saved, durable sinks)."""
        if not self.boot_id:
            return
        await self.persist_engine()
        if self.held_seq() < self._emitted_seq:
            if final:
                log.warning("kmsg: position not saved: events up to seq %d not yet held", self._emitted_seq)
            return
        pos = KmsgPosition(boot_id=self.boot_id, seq=self.last_seq, xid_folds=self.ledger.folds())
        try:
            await trio.to_thread.run_sync(atomic_write, self.position_path, dump_position(pos))
        except OSError as exc:
            log.warning("kmsg: position not saved (%s); saved again with the next records", exc.strerror or exc)
            return
        self._saved = (self.last_seq, self.boot_id)


def _device(cr: CompiledKernelRule, groups: Mapping[str, str | None]) -> str:
    name = cr.rule.device
    value = groups.get(name) if name else None
    return value[:128] if value else NODE_DEVICE


def _subcode(line: GpuLine) -> str:
    """An NVLink5 XID's unit and link (``NETIR_LINK_EVT link 09``); "" for other XIDs."""
    sub = line.detail.get("subcode", "")
    return f"{sub} link {line.detail['link']}" if sub and "link" in line.detail else sub


def _since_boot(log_path: Path, uptime_path: Path) -> float | None:
    """Seconds since boot on the clock of the records' timestamps: for the kernel's device, CLOCK_MONOTONIC (like
    the kernel's log clock it stops while the machine is suspended; /proc/uptime does not); for a fixture host's
    file, its ``proc/uptime``. None when neither can be had."""
    try:
        if stat.S_ISCHR(os.stat(log_path).st_mode):
            return time.monotonic()
    except OSError:
        pass
    try:
        return float(uptime_path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
