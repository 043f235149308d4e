"""What every collector is: a read+parse step that runs in a worker thread, and an interpret step on the loop.

A collector module holds three layers, kept apart so the middle one can be tested with tables and hypothesis:

- *read*: open files under the host roots and return their text (I/O; raises ``NotPresent`` when the source does
  not exist on this node, ``OSError`` when it exists but cannot be read);
- *parse*: plain functions of that text (no I/O), raising only ``ParseError``;
- *interpret*: turn parsed data into an ``Interpreted`` value: the ``Sample`` objects, plus (in a subclass) what a
  compat surface needs of that cycle; may keep state between ticks (counter deltas), but what it returns is a frozen
  value of its own, never a view of that state: a tier snapshot holds it, and surfaces read it from there.

``gather`` (read+parse) runs in a worker thread under a timeout because /sys reads can hang on sick hardware, unless
the collector declares that none of its reads can (``may_hang`` False): then it runs on the event loop, which saves a
thread round trip that costs more than most /proc reads. ``interpret`` runs on the event loop and must be cheap.

Every host file is read through ``read_bounded`` with a cap that fits its kind: ``SYSFS_ATTR_MAX`` for a sysfs
attribute (the kernel serves at most a page), ``PROC_FILE_MAX`` for a /proc or root file system text file,
``PROC_TABLE_MAX`` for the /proc tables that grow with the host (mounts, network tables, diskstats). A file over its
cap is an error of the collector reading it (``FileTooLarge``), found by reading at most cap + 1 bytes; a file that
is not a regular file (a sensor symlinked to /dev/zero, a FIFO) is refused, without opening it unless it lies under
the host's sysfs or procfs root (which hold no device nodes: ``SYSFS_FILE``, ``PROCFS_FILE``), and files are
opened with O_NONBLOCK so a FIFO cannot hang the open. Within a cycle, such a procfs or sysfs file is read through
the descriptor ``heldfiles.HELD`` kept open since the last cycle, with the same caps (``hostfiles``, where the
readers live), and so is a file of a host root on a local disk whose directory has not changed lately.

A text file read is then checked for its shape (``text_limits``: lines per file, bytes per line) on the bytes,
before any parser splits them; a file out of shape is a ``ParseError`` of every collector reading it. Those limits,
and what a parse may yield (fields per line, entries per file, label length, problems kept), are in ``bounds``.
"""

from __future__ import annotations

import abc
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

from nvdaemon.collectors.bounds import LINES_MAX, check_lines, line_limits
from nvdaemon.collectors.heldfiles import HELD, NOT_HELD, SETTLED_SECONDS, DirIdentity, directory_identity
from nvdaemon.collectors.hostfiles import ANY_FILE as ANY_FILE  # noqa: PLC0414 (re-exported: the readers' API)
from nvdaemon.collectors.hostfiles import PROC_FILE_MAX as PROC_FILE_MAX  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import PROC_TABLE_MAX as PROC_TABLE_MAX  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import PROCFS_FILE as PROCFS_FILE  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import SYSFS_ATTR_MAX as SYSFS_ATTR_MAX  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import SYSFS_FILE as SYSFS_FILE  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import FileTooLarge as FileTooLarge  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import HostPath as HostPath  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import NotRegularFile as NotRegularFile  # noqa: PLC0414
from nvdaemon.collectors.hostfiles import read_bounded as read_bounded  # noqa: PLC0414
from nvdaemon.goparse import ParseError as ParseError  # noqa: PLC0414 (re-exported: collectors raise it too)
from nvdaemon.model import Interpreted as Interpreted  # noqa: PLC0414 (re-exported: a tier snapshot's value, in the core)
from nvdaemon.model import ReadCounts as ReadCounts  # noqa: PLC0414 (re-exported, as Interpreted)
from nvdaemon.model import Sample

if TYPE_CHECKING:
    from nvdaemon.config import Config

T = TypeVar("T")
wall_clock_ns = time.time_ns  # what a settled directory's change time is compared with (a test moves it)


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


def text_limits(path: HostPath, limit: int) -> tuple[int, int] | None:
    """``(longest line in bytes, most lines)`` of a text file read with the byte cap ``limit``; None for a sysfs
    attribute, whose 64 KiB cap already bounds what a parse of it can make."""
    if limit <= SYSFS_ATTR_MAX:
        return None
    return line_limits(path, limit >= PROC_TABLE_MAX)


@dataclass
class Gathered:
    """What ``gather`` hands to ``interpret``: parsed data plus the partial failures met on the way.

    A collector that reads many files (one per hwmon chip, one per PCI device) keeps what it could read and lists
    the rest in ``errors``: one broken sensor must not hide the others.
    """

    data: Any
    errors: list[str] = field(default_factory=list)


def interpreted(samples: Iterable[Sample]) -> Interpreted:
    """The plain result of a collector that only has samples."""
    return Interpreted(tuple(samples))


class Collector(abc.ABC):
    """One source of samples. Instances may keep state between ticks; one tick at a time per instance."""

    name: ClassVar[str]
    tier: ClassVar[str] = "core"
    may_hang: ClassVar[bool] = True
    """Whether a read of this collector can block for good: a sysfs attribute whose driver asks the hardware (hwmon
    over I2C, a PCI device in a bad state), NVML, a subprocess. Such a gather runs in a worker thread under a timeout,
    so a hung read costs only itself. False only where every read is answered from kernel memory (/proc text files,
    directory listings, counters the kernel keeps): that gather runs on the event loop, with no thread and no
    timeout, so it must never be set on a collector that reads anything else."""

    @abc.abstractmethod
    def gather(self, roots: HostRoots) -> Gathered:
        """Read and parse (runs in a worker thread). Raise ``NotPresent`` if the source is absent on this node."""

    @abc.abstractmethod
    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        """Turn parsed data into samples stamped ``now`` (runs on the event loop; no I/O)."""

    def configure(self, config: Config) -> None:
        """Take this collector's settings from the agent's config (once, before the first gather; no I/O)."""
        return None

    def present(self, roots: HostRoots) -> bool:
        """Asked on the event loop before a gather that ``may_hang``: False when this node certainly lacks the source,
        found without a read that can hang (a directory listing). The cycle then reports the collector absent, as a
        ``NotPresent`` gather would, without calling ``gather`` or starting a worker thread for it. True (the
        default) leaves the answer to ``gather``; so does an error here."""
        return True

    def read_timeout(self, default: float) -> float:
        """How long one ``gather`` may take before it is abandoned (``collectorTimeoutSeconds`` unless overridden)."""
        return default

    def detail(self) -> dict[str, Any]:
        """Extra plain data about the last run for ``/v1/status`` (empty: nothing beyond the status)."""
        return {}


def all_uints(tokens: Sequence[str]) -> bool:
    """Whether every token is an unsigned decimal of 1 to 25 ASCII digits (``int()`` refuses very long digit strings):
    one check of the joined text, where a regex per token was most of a /proc parser's CPU. Tokens come from
    ``str.split()``, so none is empty; an empty list is all unsigned."""
    if not tokens:
        return True
    joined = "".join(tokens)
    return joined.isascii() and joined.isdigit() and max(map(len, tokens)) <= 25


def _read_file(path: HostPath, limit: int, kind: int = ANY_FILE) -> str:
    try:
        data = read_bounded(path, limit, kind)
    except FileNotFoundError as exc:
        raise NotPresent(str(path)) from exc
    return _text(data, path, limit)


def _read_held(path: str, directory: DirIdentity, limit: int, kind: int) -> str:
    """``_read_file`` of a procfs or sysfs file of ``directory`` (its identity this cycle), through the descriptor
    ``HELD`` keeps for it."""
    try:
        data = HELD.read(path, directory, limit, kind)
    except FileNotFoundError as exc:
        raise NotPresent(path) from exc
    return _text(data, path, limit)


def _text(data: bytes, path: HostPath, limit: int) -> str:
    """A file's bytes as text, once its shape is checked."""
    if len(data) > LINES_MAX:  # a shorter file is in shape whatever its kind: no line or line count can be over
        shape = text_limits(path, limit)
        if shape is not None:
            check_lines(data, path, *shape)
    return data.decode("utf-8", errors="replace")


_PENDING: Any = object()  # an entry's value while its owner is still reading (or parsing) it
_UNKNOWN: Any = object()  # a directory not yet stat'ed this cycle


class _Entry:
    """A file's text (or its parse) in a cycle's cache: ``_PENDING`` until its owner, the thread that put it in the
    table, has its value or its error."""

    __slots__ = ("error", "value")

    def __init__(self) -> None:
        self.value: Any = _PENDING
        self.error: BaseException | None = None


class CycleReads:
    """The files read (and parsed) during one tier cycle, so two surfaces over the same file read it once.

    The nodevitals_hw_* collectors and the node_exporter surface both read /proc/stat, /proc/meminfo,
    /proc/diskstats and more in the same cycle, and node_exporter's cpu and stat collectors both parse /proc/stat;
    whichever thread asks first does the work, the others wait for its result (value or error). Worker threads see
    the cycle's cache because Trio runs them in a copy of the caller's context.

    A core tick asks for some 650 files, so the way to a file is kept short (it cost 1.3 us a file, as much as a
    syscall; 0.8 us now): the thread whose entry ``dict.setdefault`` put in the table (one atomic step) owns it,
    with no lock taken; only a thread that finds an entry still being read takes the condition, and an owner
    notifies only when someone waits (a file asked for by two threads at the same moment, which is rare).
    """

    def __init__(self) -> None:
        # Keyed by the path's string: hashing a Path made this cycle costs as much again as the string, which the
        # read needs anyway.
        self._entries: dict[str, _Entry] = {}
        self._parsed: dict[tuple[str, Callable[[str, str], Any]], _Entry] = {}
        self._hits: list[None] = []  # one per read answered from the cache (list.append is atomic; += is not)
        self._failed: list[_Entry] = []  # entries holding an error (see close)
        self._done = threading.Condition(threading.Lock())
        self._waiting = 0  # threads waiting on ``_done`` (changed only while holding it)
        # The identity of each directory a held file was asked in, stat'ed once this cycle (None: its files read
        # afresh this cycle); a settled directory changed since this instant is not trusted (``heldfiles``).
        self._dirs: dict[str, DirIdentity | None] = {}
        # Directories stat'ed (symlinks followed) and listed this cycle: a hwmon chip's directory was stat'ed six
        # times a tick and listed twice, by the two hwmon collectors, their fixed attributes and the held reads.
        self._stats: dict[str, os.stat_result] = {}
        self._listings: dict[str, list[tuple[str, bool]]] = {}
        self._settled_before_ns = wall_clock_ns() - int(SETTLED_SECONDS * 1e9)
        HELD.sweep(time.monotonic())

    @property
    def reads(self) -> int:
        """Files actually read: one entry each."""
        return len(self._entries)

    @property
    def shared(self) -> int:
        """Reads answered from the cache."""
        return len(self._hits)

    @property
    def paths(self) -> list[str]:
        """The files this cycle asked for, in first-asked order (``make bench`` reads them again as its floor)."""
        return list(self._entries)  # one step under the GIL, as the setdefault that adds to it

    def counts(self) -> ReadCounts:
        """The counts so far, as a value (an abandoned worker thread may still read after the cycle ends)."""
        entries = tuple(self._entries)
        return ReadCounts(len(entries), len(self._hits), entries)

    def _fill(self, entry: _Entry, compute: Callable[..., Any], *args: Any) -> Any:
        """The owner's part: compute the entry's value (or error), then wake whoever waits for it."""
        value = None
        try:
            value = compute(*args)
        except Exception as exc:
            self._keep_error(entry, exc)
        finally:  # whatever happened, no waiter waits for good
            entry.value = value  # after the error: a waiter that sees the value set sees the error too
            self._wake()
        return _result(entry)

    def _wake(self) -> None:
        """Wake the threads waiting for an entry (notified only when there are any: rare)."""
        if self._waiting:
            with self._done:
                self._done.notify_all()

    def _keep_error(self, entry: _Entry, error: Exception) -> None:
        """Keep ``error`` as the entry's, without its traceback nor those of the errors it was raised from: they hold
        the frames that raised it, and so what they had read (a refused 4 MB line) and this cache itself (see
        close)."""
        entry.error = without_tracebacks(error)
        self._failed.append(entry)

    def _refused(self, entry: _Entry, error: Exception) -> NoReturn:
        """``_fill``'s error half, for the held read that ``read`` makes itself: keep ``error`` as the entry's, wake
        whoever waits, raise it."""
        self._keep_error(entry, error)
        entry.value = None
        self._wake()
        del entry
        try:
            raise error
        finally:
            del error  # as in _result: a local naming the raised error would make a reference cycle

    def close(self) -> None:
        """The cycle is over: drop the tracebacks its errors took on as they were raised to each reader.

        A stored error raised again (``_result``) carries the frames it went through, whose locals hold the entry,
        this cache and the collectors' families: a reference cycle, so a tick in which one file was missing left its
        whole cache (every text it read) to the cyclic garbage collector: 4,339 objects a core tick with the
        node_* surface on gpunode. Without the tracebacks the cache goes by reference counting when the tick ends.
        """
        for entry in self._failed:
            if entry.error is not None:
                without_tracebacks(entry.error)

    def _wait(self, entry: _Entry) -> Any:
        """A value another thread is computing, once it has it (value or error)."""
        with self._done:
            self._waiting += 1
            try:
                while entry.value is _PENDING:  # checked after counting ourselves in: the owner then notifies
                    self._done.wait()
            finally:
                self._waiting -= 1
        return _result(entry)

    def read(self, path: HostPath, limit: int = PROC_FILE_MAX, kind: int = ANY_FILE) -> str:
        """A file's text, read once per cycle (a path is always read with the same cap and kind: those of where it
        lives)."""
        where = path if path.__class__ is str else os.fspath(path)
        entry = self._entries.get(where)
        if entry is None:
            fresh = _Entry()
            entry = self._entries.setdefault(where, fresh)
            if entry is fresh:
                if kind == ANY_FILE:
                    text: str = self._fill(fresh, _read_file, where, limit, kind)
                    return text
                # A procfs or sysfs file of a directory already stat'ed this cycle: straight to its held read,
                # with what _fill and _read_pseudo do around it inlined (most of a core tick's ~530 files: 2.1-2.7 ->
                # 1.85-2.3 us a held hwmon attribute through read_attr, pread and decode alone 0.65-0.9).
                identity = self._dirs.get(where.rpartition("/")[0])
                if identity is None:  # not stat'ed yet, or read afresh this cycle: the longer way
                    text = self._fill(fresh, self._read_pseudo, where, limit, kind)
                    return text
                try:
                    text = _read_held(where, identity, limit, kind)
                except Exception as exc:
                    self._refused(fresh, exc)
                except BaseException:  # a cancellation or an interrupt: as _fill's finally, no waiter waits for good
                    fresh.value = None
                    self._wake()
                    raise
                fresh.value = text
                self._wake()
                return text
        self._hits.append(None)
        shared: str = _result(entry) if entry.value is not _PENDING else self._wait(entry)
        return shared

    def stat(self, path: str) -> os.stat_result:
        """``os.stat(path)`` as of the first time this cycle asked (an error is not kept: asked again, raised again)."""
        st = self._stats.get(path)
        if st is None:
            st = self._stats[path] = os.stat(path)
        return st

    def listing(self, directory: str) -> list[tuple[str, bool]]:
        """``(name, is a directory)`` of each entry of ``directory`` (its type as listed: a symlink is not followed),
        as of the first time this cycle asked; the list is shared, never to be changed."""
        key = directory.rstrip("/") or directory
        found = self._listings.get(key)
        if found is None:
            found = self._listings[key] = _list_directory(key)
        return found

    def _read_pseudo(self, path: str, limit: int, kind: int) -> str:
        """``_read_file`` of a procfs or sysfs file, through the descriptor ``HELD`` keeps for it when its directory
        is the one it was opened in (``heldfiles``: one pread instead of four syscalls and a path walk)."""
        directory = path.rpartition("/")[0]
        if HELD.elsewhere(directory):  # on a file system whose files are never held: opened every cycle
            return _read_file(path, limit, kind)
        identity = self._dirs.get(directory, _UNKNOWN)
        if identity is _UNKNOWN:
            try:
                st = self.stat(directory)
            except OSError:
                identity = None
            else:
                held_as = HELD.device_kind(st.st_dev)
                if held_as == NOT_HELD:
                    HELD.mark_elsewhere(directory)
                identity = directory_identity(st, held_as, self._settled_before_ns)
            self._dirs[directory] = identity
        if identity is None:
            return _read_file(path, limit, kind)  # gone, refused, changed lately, or elsewhere: as a plain read
        return _read_held(path, identity, limit, kind)

    def parsed(self, path: HostPath, parse: Callable[[str, str], T], limit: int = PROC_FILE_MAX) -> T:
        """``parse(text, str(path))`` once per cycle; callers must treat the result as read-only."""
        where = os.fspath(path)
        key = (where, parse)
        entry = self._parsed.get(key)
        if entry is None:
            fresh = _Entry()
            entry = self._parsed.setdefault(key, fresh)
            if entry is fresh:
                value: T = self._fill(fresh, lambda: parse(self.read(where, limit), where))
                return value
        shared: T = _result(entry) if entry.value is not _PENDING else self._wait(entry)
        return shared


def without_tracebacks(error: BaseException) -> BaseException:
    """``error`` with the traceback taken off it and off the errors it was raised from or while handling
    (``__cause__``, ``__context__``; at most 16 of them)."""
    todo: list[BaseException] = [error]
    seen: set[int] = set()
    while todo and len(seen) < 16:
        exc = todo.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        exc.__traceback__ = None
        todo.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
    return error


def _result(entry: _Entry) -> Any:
    """A finished entry's value, or its error raised."""
    error = entry.error
    if error is None:
        return entry.value
    del entry
    try:
        raise error
    finally:
        # The traceback now points at this frame: a local naming the error would make a cycle (frame -> error
        # -> traceback -> frame) that only the garbage collector frees, tick after tick.
        del error


CYCLE_READS: ContextVar[CycleReads | None] = ContextVar("cycle_reads", default=None)


def cycle_stat(path: str) -> os.stat_result:
    """``os.stat(path)`` (symlinks followed), once per tier cycle for every collector asking (``CycleReads.stat``)."""
    cache = CYCLE_READS.get()
    return os.stat(path) if cache is None else cache.stat(path)


def cycle_listing(directory: str) -> list[tuple[str, bool]]:
    """``(name, is a directory)`` of each entry of ``directory``, listed once per tier cycle for every collector asking
    (``CycleReads.listing``); raises as ``os.scandir`` does. Never change the list: it is shared."""
    cache = CYCLE_READS.get()
    return _list_directory(directory) if cache is None else cache.listing(directory)


def _list_directory(directory: str) -> list[tuple[str, bool]]:
    """``(name, is a directory)`` of each entry, the type as listed (a symlink is not followed)."""
    with os.scandir(directory) as entries:
        return [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]


def read_text(path: HostPath, limit: int = PROC_FILE_MAX, kind: int = ANY_FILE) -> str:
    """Read a pseudo file of at most ``limit`` bytes. Missing file -> ``NotPresent``; other errors (``FileTooLarge``
    and ``NotRegularFile`` included) propagate as ``OSError``. ``kind`` says where the file lives (``ANY_FILE``
    unless the caller knows it is under the host's procfs or sysfs root).

    Within a tier cycle the text comes from the cycle's shared cache (``CycleReads``): each file is read once.
    """
    cache = CYCLE_READS.get()
    return _read_file(path, limit, kind) if cache is None else cache.read(path, limit, kind)


def read_attr(path: HostPath) -> str:
    """``read_text`` of a sysfs attribute (at most ``SYSFS_ATTR_MAX`` bytes): only for paths under the host's sysfs
    root, which are read without a stat before the open (``SYSFS_FILE``)."""
    cache = CYCLE_READS.get()
    if cache is None:
        return _read_file(path, SYSFS_ATTR_MAX, SYSFS_FILE)
    return cache.read(path, SYSFS_ATTR_MAX, SYSFS_FILE)


def read_proc(path: HostPath) -> str:
    """``read_text`` of a file of the host's procfs outside its process directories (``PROCFS_FILE``: opened without a
    stat, and held between cycles as the node_* surface holds the same file)."""
    return read_text(path, PROC_FILE_MAX, PROCFS_FILE)


def read_table(path: HostPath) -> str:
    """``read_proc`` of a /proc table that grows with the host (at most ``PROC_TABLE_MAX`` bytes)."""
    return read_text(path, PROC_TABLE_MAX, PROCFS_FILE)


def read_parsed(path: HostPath, parse: Callable[[str, str], T], limit: int = PROC_FILE_MAX) -> T:
    """``parse(text, str(path))`` of a pseudo file, computed once per tier cycle for every collector asking."""
    cache = CYCLE_READS.get()
    return parse(_read_file(path, limit), str(path)) if cache is None else cache.parsed(path, parse, limit)
