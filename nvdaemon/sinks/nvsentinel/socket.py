"""The platform-connector's socket as NVSentinel's sink sees it: what is at its path (``socket_state``, stat'ed
before every send by ``wire.GrpcPublisher``), and the streaks of sends skipped while it is unusable, logged
once when a streak starts and once when it ends (``SocketStreak``). How the log lines name a change (``describe``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import time
from collections.abc import Iterator

from nvdaemon.sinks.nvsentinel.map import Change


class SocketMissing(Exception):
    """The platform-connector's socket is not at its path: skip, do not retry. ``state`` is what is there instead
    (``socket_state``)."""

    def __init__(self, path: str, state: str) -> None:
        super().__init__(f"socket {path}: {state}")
        self.path = path
        self.state = state


MISSING = "missing"
_KINDS = {
    stat.S_IFREG: "regular file",
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


def socket_state(path: str) -> str | None:
    """None when ``path`` can be connected to (a socket, or a stat error other than ENOENT: see
    ``wire.GrpcPublisher.present``); else ``MISSING`` (nothing there, a dangling symlink included) or
    ``not a socket: <kind>``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return MISSING
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return None
    return f"not a socket: {_KINDS.get(stat.S_IFMT(mode), 'unknown file type')}"


class SocketStreak:
    """The socket's state across sends, so that a streak of skipped sends is logged once when it starts and once
    when it ends, not per send. The start line names what the first pass of the streak skipped (ERROR when a fatal
    fault is among them: NVSentinel will not act on it; else WARNING); the end line (INFO) how long the streak lasted
    and how many sends it skipped. A change of what is at the path (a file replaced by a directory) is logged as a
    new start. ``present``: None until the first send."""

    def __init__(self, path: str, log: logging.Logger) -> None:
        self.path = path
        self.log = log
        self.present: bool | None = None
        self.problem: str | None = None  # SocketMissing.state while a streak lasts
        self.since = 0.0  # time.monotonic() at the streak's start
        self.skipped = 0  # sends skipped in the streak
        self.unlogged: list[tuple[str, bool]] | None = None  # (what, fatal) skipped in a new streak's first pass
        self.in_pass = False

    def state(self) -> str | None:
        return self.problem or ("present" if self.present else None)

    @contextlib.contextmanager
    def one_pass(self) -> Iterator[None]:
        """A reconcile pass: a streak that starts in it is logged at its end, with everything it skipped."""
        self.in_pass = True
        try:
            yield
        finally:
            self.in_pass = False
            self._log_start()

    def unusable(self, problem: str, what: str, fatal: bool) -> None:
        """A send of ``what`` (``describe``) was skipped because of ``problem`` (``SocketMissing.state``)."""
        self.present = False
        if problem != self.problem:
            if self.problem is None:
                self.since, self.skipped = time.monotonic(), 0
            self.problem, self.unlogged = problem, []
        self.skipped += 1
        if self.unlogged is not None:
            self.unlogged.append((what, fatal))
        if not self.in_pass:
            self._log_start()

    def usable(self) -> bool:
        """A send got past the socket gate; True when that ended a streak."""
        self.present = True
        if self.problem is None:
            return False
        self._log_start()
        self.log.info(
            "nvsentinel: platform-connector socket %s is back after %.1fs (was %s); %d send(s) skipped meanwhile",
            self.path,
            time.monotonic() - self.since,
            self.problem,
            self.skipped,
        )
        self.problem = None
        return True

    def _log_start(self) -> None:
        skipped, self.unlogged = self.unlogged, None
        if not skipped:
            return
        shown = ", ".join(what for what, _ in skipped[:5])
        if len(skipped) > 5:
            shown += f" and {len(skipped) - 5} more"
        self.log.log(
            logging.ERROR if any(f for _, f in skipped) else logging.WARNING,
            "nvsentinel: platform-connector socket %s: %s; health events are not sent until it is back (each skip "
            "counted in nvsentinel_health_events_publisher_skipped_pc_unavailable, tried again every tick); "
            "skipped: %s",
            self.path,
            self.problem,
            shown,
        )


def fatal(change: Change) -> bool:
    """A fault NVSentinel would act on (a node condition): fatal and unhealthy."""
    return change.event.is_fatal and not change.event.is_healthy


def describe(change: Change) -> str:
    """``raise NvdaemonCpuPackageHot GPU=0 (fatal)``: a change as the socket's log lines name it."""
    what = " ".join(f"{e.type}={e.value}" for e in change.key[1])
    return f"{change.kind} {change.key[0]}" + (f" {what}" if what else "") + (" (fatal)" if fatal(change) else "")
