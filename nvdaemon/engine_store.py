"""The rule engine's state in stateDir: ``engine.json`` (the event seq, the active rule conditions, the lost GPUs)
and the seq's durable mark ``seqmark.json`` (``seqmark.py``).

When it is saved: after each tier tick, when a reload applies a config, and once at shutdown, and only when events
changed it since (``mark_dirty``). What may be saved: never a state past an event that a durable sink (the webhook
spool) does not hold yet. Saved state with an unspooled ENTER would lose that ENTER to a crash, while unsaved state
only makes a restart detect the transition again (at-least-once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import msgspec
import trio

from nvdaemon import engine
from nvdaemon.seqmark import MARK_FILE, SeqMark
from nvdaemon.statefile import atomic_write, quarantine

log = logging.getLogger(__name__)

ENGINE_FILE = "engine.json"


class Committing(Protocol):
    """A durable sink as the store waits on it: the seq of the last event it holds durably."""

    @property
    def name(self) -> str: ...
    @property
    def committed_seq(self) -> int: ...
    async def wait_committed(self, seq: int) -> None: ...


class EngineStore:
    """Loads and saves one agent's engine state. ``state_dir`` is read at each save (a reload may move stateDir);
    ``durable`` lists the durable sinks running now; ``durable_wait`` is how long, in seconds, a save waits for them
    to hold the events it covers; ``write`` writes a file whole or not at all (``statefile.atomic_write``)."""

    def __init__(
        self,
        state_dir: Callable[[], Path],
        durable: Callable[[], Iterable[Committing]],
        *,
        durable_wait: float,
        write: Callable[[Path, bytes], None] = atomic_write,
    ) -> None:
        self._state_dir = state_dir
        self._durable = durable
        self._durable_wait = durable_wait
        self._write = write
        self.seqmark = SeqMark()  # event seqs are issued only under a mark saved in stateDir (seqmark.py)
        self.save_error: str | None = None  # why the last engine.json write failed (a full stateDir)
        self._dirty = False
        self._saved_seq = -1  # the event seq of the engine state last written to stateDir
        self._durable_warned = False
        self._lock = trio.Lock()

    @property
    def path(self) -> Path:
        return self._state_dir() / ENGINE_FILE

    @property
    def mark_path(self) -> Path:
        return self._state_dir() / MARK_FILE

    def mark_dirty(self) -> None:
        """Events changed the state: the next ``persist`` saves it."""
        self._dirty = True

    def load(self, state: engine.EngineState) -> engine.EngineState:
        """The state saved in ``engine.json`` (``state`` when there is none), its event seq carried forward to the
        durable mark of ``seqmark.json`` (the seq continues from the greater of the two). A damaged file is moved
        aside, never a crash loop. Until ``reserve`` has saved a new mark, seqs issued count as unreserved."""
        path = self.path
        try:
            data: bytes | None = path.read_bytes()
        except FileNotFoundError:
            data = None
        if data is not None:
            try:
                state = engine.load_state(data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                quarantine(path, str(exc))
            else:
                log.info(
                    "restored %d active condition(s) (%d rule, %d lost GPU), event seq %d",
                    len(state.active) + len(state.lost_gpus),
                    len(state.active),
                    len(state.lost_gpus),
                    state.seq,
                )
        self.seqmark.load(state, self.mark_path)
        return state

    async def reserve(self, state: engine.EngineState) -> None:
        """Before the first event: a block of seqs reserved in stateDir (a refusal is logged; events go on)."""
        await self.seqmark.reserve(state, self.mark_path)

    async def persist(self, state: engine.EngineState, *, strict: bool = False) -> None:
        """Save ``state`` once every durable sink holds the events that led there. A durable sink whose spool
        refuses writes holds its ``committed_seq`` back, so nothing is saved past what it holds only in memory. A
        write stateDir refuses is logged (once per streak) and retried on the next call; it is raised (OSError) only
        when ``strict``: a reload applying a config rolls back on it. First, every call keeps the event seq's durable
        mark ahead of the seqs issued (``seqmark.py``; a write only once half of its block is used)."""
        await self.seqmark.keep_ahead(state, self.mark_path)
        if not self._dirty:
            return
        target = state.seq
        # The state that goes with seq `target`, taken now: another tier, an XID or a reload may emit while we
        # wait, and a dump taken after the wait would record transitions the spool may not hold yet.
        data = engine.dump_state(state)
        with trio.move_on_after(self._durable_wait) as waited:
            for sink in list(self._durable()):
                await sink.wait_committed(target)
        if waited.cancelled_caught:
            lagging = [s.name for s in self._durable() if s.committed_seq < target]
            if not self._durable_warned:
                log.warning("engine state not saved yet: events up to seq %d not yet spooled by %s", target, lagging)
            self._durable_warned = True
            return
        self._durable_warned = False
        async with self._lock:
            if target < self._saved_seq:  # a concurrent call already saved a newer state
                return
            try:
                await trio.to_thread.run_sync(self._write, self.path, data)
            except OSError as exc:
                # A full or read-only stateDir: the old file stays (at-least-once: a restart detects the newer
                # transitions again); the state stays dirty and the next tick tries again. Never a tier crash.
                if self.save_error is None:
                    log.error("engine state not saved (%s); retried every tick", exc.strerror or exc)
                self.save_error = exc.strerror or str(exc)
                if strict:
                    raise
                return
            if self.save_error is not None:
                log.info("engine state saved again")
                self.save_error = None
            self._saved_seq = target
            if state.seq == target:  # else events came while waiting: their state is saved next time
                self._dirty = False
