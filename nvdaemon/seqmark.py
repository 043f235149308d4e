"""The durable high-water mark of event seqs: ``stateDir/seqmark.json`` (JSON ``{"version": 1, "reserved": N}``).

``engine.json`` is saved only once the durable sinks hold the events that led there, so it may lag behind the seqs
already issued (a stateDir that turned read-only mid-run, a crash): restoring its seq alone would issue some seqs a
second time. The mark is a reservation ahead of them instead: every seq up to ``reserved`` may have been issued.

- Start (``load``, then ``reserve`` before the first event): the seq continues from the greater of ``engine.json``'s
  and the mark, and a new block of ``BLOCK`` seqs is reserved at once. A restart therefore skips up to ``BLOCK``
  seqs: a gap in seq is not a lost event.
- Running (``keep_ahead``, from every tick's engine-state save): once half of the block is issued, the next one is
  reserved, in a worker thread; the event path itself never waits for the disk.
- A stateDir that refuses the write (EROFS, ENOSPC, EIO, EACCES): logged once per streak and retried every tick;
  seqs keep being issued (an event is never held back), still covered by the last saved mark for at least half a
  block. Seqs issued past it are counted (``EngineState.unreserved``) and logged once: only a restart before the
  next reservation is saved could issue those again.

The mark only moves forward; nothing here lowers it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec
import trio

from nvdaemon.engine import EngineState
from nvdaemon.statefile import atomic_write, quarantine

log = logging.getLogger(__name__)

MARK_FILE = "seqmark.json"
BLOCK = 1024  # seqs reserved by one write: a restart skips at most this many; one write per BLOCK / 2 events


class _Mark(msgspec.Struct):
    version: int
    reserved: int


def read_mark(path: Path) -> int:
    """The mark saved at ``path``; 0 when there is none. A damaged file is moved aside (logged) and counts as none:
    the seqs of the runs before may then be issued again, which the log line says. Other read errors raise
    OSError: a stateDir that cannot be read stops the start, as ``engine.json`` would."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    try:
        mark = msgspec.json.decode(data, type=_Mark)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        quarantine(path, f"{exc}; event seqs continue from engine.json's and may repeat earlier ones")
        return 0
    return max(mark.reserved, 0)


class SeqMark:
    """Keeps ``EngineState.reserved`` saved ahead of ``EngineState.seq``; touched only from the trio thread."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.saved = 0  # the highest mark read or written
        self.saved_at: Path | None = None  # where it was written (a reload may move stateDir)
        self.error: str | None = None  # why the last write failed, while it keeps failing
        self._warned_past = False  # the seqs issued past the mark were logged (once per streak)
        self._lock = trio.Lock()  # one write at a time: atomic_write's temporary file is one per target

    def load(self, state: EngineState, path: Path) -> None:
        """At start, before any event: continue from the saved mark when it is ahead of the restored seq. Until a
        new mark is saved (``reserve``), every seq issued counts as unreserved."""
        mark = read_mark(path)
        self.saved = max(self.saved, mark)
        if mark > state.seq:
            log.info("event seq continues from %d, the mark reserved before (engine.json had %d)", mark, state.seq)
            state.seq = mark
        state.reserved = state.seq

    def needed(self, state: EngineState, path: Path) -> bool:
        """Less than half a block is left (or none was saved in this stateDir yet)."""
        reserved = state.reserved if state.reserved is not None else state.seq
        return reserved - state.seq < self.block // 2 or path != self.saved_at

    async def reserve(self, state: EngineState, path: Path, *, force: bool = True) -> bool:
        """Save a mark ``block`` seqs ahead of the last one issued (never below one saved before), in a worker
        thread; on success ``state.reserved`` moves up to it. False when stateDir refused the write (logged once
        per streak; the caller tries again later). ``force=False``: only when still ``needed`` once the lock is
        held (another tier's tick may have just saved one)."""
        async with self._lock:
            if not force and not self.needed(state, path):
                return True
            mark = max(state.seq + self.block, self.saved)
            data = msgspec.json.encode(_Mark(version=1, reserved=mark))
            try:
                await trio.to_thread.run_sync(atomic_write, path, data)
            except OSError as exc:
                why = exc.strerror or str(exc)
                if self.error is None:
                    log.error(
                        "event seq mark not saved (%s): seqs stay unique up to %s; retried every tick",
                        why,
                        state.reserved,
                    )
                self.error = why
                return False
            if self.error is not None:
                log.info("event seq mark saved again: seqs up to %d reserved", mark)
                self.error = None
            self.saved, self.saved_at = mark, path
            # Only after the write is durable: ``reserved`` never claims more than stateDir holds.
            state.reserved = max(state.reserved or 0, mark)
            self._warned_past = False
            return True

    async def keep_ahead(self, state: EngineState, path: Path) -> None:
        """Every tick: reserve the next block once half of this one is issued (or stateDir moved); say once when
        seqs were issued past the saved mark. Nothing to do while no mark is kept (``load`` was not called)."""
        if state.reserved is None:
            return
        if state.seq > state.reserved and not self._warned_past:
            self._warned_past = True
            log.error(
                "event seq %d issued past the saved mark %d (%s): a restart before a new mark is saved could issue "
                "seqs from %d again (eventSeqUnreserved in /v1/status counts them)",
                state.seq,
                state.reserved,
                self.error or "not saved yet",
                state.reserved + 1,
            )
        if self.needed(state, path):
            await self.reserve(state, path, force=False)


__all__ = ["BLOCK", "MARK_FILE", "SeqMark", "read_mark"]
