"""How old a spooled event is, measured on a clock that an NTP step, an operator's ``date -s`` or a bad RTC at boot
cannot move.

The wall clock (``time.time()``) is what an event's enqueue time is shown in, but it steps: forward by days when a
node's RTC was wrong and NTP corrects it, backward just as easily. An age taken from it would turn a backlog that
is seconds old into expired dead letters at once (or keep really old ones forever). So each spool row also carries
a stamp on the kernel's ``CLOCK_BOOTTIME`` (seconds since boot, counting time spent suspended, never stepped) and
the boot it counts from (``/proc/sys/kernel/random/boot_id``, a random id the kernel draws at every boot):

- same boot: the age is the difference of the two boottime readings, whatever the wall clock did meanwhile;
- a row from another boot (the node rebooted while events were spooled), or one written before rows carried the
  stamp: boottime restarted at zero, so the wall clock is all there is. Its difference is used, clamped at zero so
  a backward step never makes an age negative (a forward step across a reboot can still age such a row early).

The boot id is read from this process's own ``/proc``, not from ``procRoot``: it has to name the kernel whose
``CLOCK_BOOTTIME`` this process reads, and only its own ``/proc`` is sure to (``procRoot`` may be a copy or a
fixture). Where it cannot be read, or the platform has no ``CLOCK_BOOTTIME`` (then ``time.monotonic``, which does
not count a suspend), the stamps are trusted within this process only: the id is a random one of this process.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class SteadyClock:
    """Seconds on a clock that does not step (``now``), and the id of the run of that clock (``boot_id``): two
    readings with the same id may be subtracted, readings with different ids may not."""

    boot_id: str
    now: Callable[[], float]

    def stamp(self) -> tuple[str, float]:
        """``(boot_id, seconds)``: what a spool row stores beside its wall-clock enqueue time."""
        return self.boot_id, self.now()

    def age(self, wall_now: float, enqueued: float, boot_id: str | None, boottime: float | None) -> float:
        """Seconds since an event stamped ``enqueued`` (wall clock) and ``(boot_id, boottime)`` (this clock), never
        negative: on this clock when the stamp is from this run of it, else on the wall clock (``wall_now``)."""
        if boottime is not None and boot_id == self.boot_id:
            return max(0.0, self.now() - boottime)
        return max(0.0, wall_now - enqueued)


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def read_boot_id(path: Path = BOOT_ID) -> str | None:
    """The kernel's boot id (``/proc/sys/kernel/random/boot_id``, or the same file under a procRoot); None when it
    cannot be read."""
    try:
        return path.read_text(encoding="ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


@functools.cache
def system_clock() -> SteadyClock:
    """This node's ``CLOCK_BOOTTIME`` and boot id (read once: it cannot change while the process runs)."""
    process_only = f"process:{uuid.uuid4()}"
    if not hasattr(time, "CLOCK_BOOTTIME"):
        return SteadyClock(process_only, time.monotonic)
    boot_id = read_boot_id()
    if boot_id is None:
        log.warning(
            "the boot id (%s) cannot be read: spooled events' ages fall back to the wall clock after a restart", BOOT_ID
        )
        return SteadyClock(process_only, _boottime)
    return SteadyClock(boot_id, _boottime)
