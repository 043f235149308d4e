"""What every collector is: a read+parse step that runs in a worker thread, and an interpret step on the loop.

A collector module holds three layers, kept apart so the middle one can be tested with tables and hypothesis:

- *read*: open files under the host roots and return their text (I/O; raises ``NotPresent`` when the source does
  not exist on this node, ``OSError`` when it exists but cannot be read);
- *parse*: plain functions of that text (no I/O), raising only ``ParseError``;
- *interpret*: turn parsed data into ``Sample`` objects; may keep state between ticks (counter deltas).

``gather`` (read+parse) runs in a worker thread under a timeout because /sys reads can hang on sick hardware;
``interpret`` runs on the event loop and must be cheap.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from nvdaemon.model import Sample

if TYPE_CHECKING:
    from nvdaemon.config import Config

T = TypeVar("T")


@dataclass(frozen=True)
class HostRoots:
    """Where the host's pseudo file systems are mounted (``/host/proc`` in a pod, a fixture tree in tests)."""

    proc: Path = Path("/proc")
    sys: Path = Path("/sys")
    dev: Path = Path("/dev")
    rootfs: Path = Path("/")

    @classmethod
    def under(cls, root: Path) -> HostRoots:
        return cls(proc=root / "proc", sys=root / "sys", dev=root / "dev", rootfs=root)


class NotPresent(Exception):  # a state ("this node has no such source"), not a failure
    """The source this collector reads does not exist on this node (no RAPL, no PSI, no AER)."""


class ParseError(ValueError):
    """A file had content the parser could not understand; the message names the file and what was wrong."""


@dataclass
class Gathered:
    """What ``gather`` hands to ``interpret``: parsed data plus the partial failures met on the way.

    A collector that reads many files (one per hwmon chip, one per PCI device) keeps what it could read and lists
    the rest in ``errors``: one broken sensor must not hide the others.
    """

    data: Any
    errors: list[str] = field(default_factory=list)


class Collector(abc.ABC):
    """One source of samples. Instances may keep state between ticks; one tick at a time per instance."""

    name: ClassVar[str]
    tier: ClassVar[str] = "core"

    @abc.abstractmethod
    def gather(self, roots: HostRoots) -> Gathered:
        """Read and parse (runs in a worker thread). Raise ``NotPresent`` if the source is absent on this node."""

    @abc.abstractmethod
    def interpret(self, gathered: Gathered, now: float) -> list[Sample]:
        """Turn parsed data into samples stamped ``now`` (runs on the event loop; no I/O)."""

    def configure(self, config: Config) -> None:
        """Take this collector's settings from the agent's config (once, before the first gather; no I/O)."""
        return None

    def read_timeout(self, default: float) -> float:
        """How long one ``gather`` may take before it is abandoned (``collectorTimeoutSeconds`` unless overridden)."""
        return default

    def detail(self) -> dict[str, Any]:
        """Extra plain data about the last run for ``/v1/state`` (empty: nothing beyond the status)."""
        return {}


def _read_file(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise NotPresent(str(path)) from exc


class _Entry:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class CycleReads:
    """The files read (and parsed) during one tier cycle, so two surfaces over the same file read it once.

    The nodevitals_hw_* collectors and the node_exporter surface both read /proc/stat, /proc/meminfo,
    /proc/diskstats and more in the same cycle, and node_exporter's cpu and stat collectors both parse /proc/stat;
    whichever thread asks first does the work, the others wait for its result (value or error). Worker threads see
    the cycle's cache because Trio runs them in a copy of the caller's context.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Path, _Entry] = {}
        self._parsed: dict[tuple[Path, Callable[[str, str], Any]], _Entry] = {}
        self.reads = 0  # files actually read
        self.shared = 0  # reads answered from the cache

    @property
    def paths(self) -> list[Path]:
        """The files this cycle asked for, in first-asked order (``make bench`` reads them again as its floor)."""
        with self._lock:
            return list(self._entries)

    def _once(self, table: dict[Any, _Entry], key: Any, compute: Callable[[], Any], count: bool) -> Any:
        with self._lock:
            entry = table.get(key)
            owner = entry is None
            if entry is None:
                entry = table[key] = _Entry()
            if count:
                self.reads += owner
                self.shared += not owner
        if owner:
            try:
                entry.value = compute()
            except Exception as exc:
                entry.error = exc
            finally:
                entry.done.set()
        else:
            entry.done.wait()
        if entry.error is not None:
            raise entry.error
        return entry.value

    def read(self, path: Path) -> str:
        text: str = self._once(self._entries, path, lambda: _read_file(path), count=True)
        return text

    def parsed(self, path: Path, parse: Callable[[str, str], T]) -> T:
        """``parse(text, str(path))`` once per cycle; callers must treat the result as read-only."""
        value: T = self._once(self._parsed, (path, parse), lambda: parse(self.read(path), str(path)), count=False)
        return value


CYCLE_READS: ContextVar[CycleReads | None] = ContextVar("cycle_reads", default=None)


def read_text(path: Path) -> str:
    """Read a small pseudo file. Missing file -> ``NotPresent``; other errors propagate as ``OSError``.

    Within a tier cycle the text comes from the cycle's shared cache (``CycleReads``): each file is read once.
    """
    cache = CYCLE_READS.get()
    return _read_file(path) if cache is None else cache.read(path)


def read_parsed(path: Path, parse: Callable[[str, str], T]) -> T:
    """``parse(text, str(path))`` of a pseudo file, computed once per tier cycle for every collector asking."""
    cache = CYCLE_READS.get()
    return parse(_read_file(path), str(path)) if cache is None else cache.parsed(path, parse)
