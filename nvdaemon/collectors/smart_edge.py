"""The smart tier's edge to smartctl: pySMART, imported with its side effects contained, and its subprocess call
replaced.

pySMART runs each device's smartctl invocations (type detection once per device, then ``--all``) and parses them.
The narrow edge it calls is replaced (``RecordingSmartctl``) so that every run

- carries ``--nocheck=standby``: a sleeping disk answers "in STANDBY mode" and is left asleep, never spun up;
- runs in its own process group with the C locale and a hard timeout (``smart.timeoutSeconds``), after which the
  whole group is SIGKILLed and reaped: a stuck smartctl is killed, never abandoned;
- has its stdout and stderr read in 64 KiB chunks through a byte limit (``STDOUT_LIMIT``, 1 MiB): one that prints
  more is killed the same way, and the device is reported broken for that cycle;
- is recorded (arguments, exit status, output) so the collector can tell *unreadable* (open refused: permission,
  capability), *standby*, *timeout* and *unparseable* apart, which pySMART itself does not report.

pySMART is imported only when the tier runs (it costs ~11 MB), with its process-wide side effects undone: it sets
``os.environ["LANG"] = "C"`` and installs its logger class for every logger created afterwards. The C locale is
given to the smartctl child processes only.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

NOCHECK = "--nocheck=standby"


# What one smartctl run may print. ``smartctl --all`` prints 5-20 KB for a SATA or NVMe disk and a few tens of KB for
# a SAS disk with long logs (the recordings in fixtures/smartctl are 3-7 KB); 1 MiB is tens of times the largest real
# output and keeps the worst case small: ``smart.maxConcurrent`` runs (4 by default) each hold at most this as bytes
# and once more as text. A run that prints more is not smartctl answering: it is killed, the device reported broken.
STDOUT_LIMIT = 1024 * 1024
STDERR_LIMIT = 64 * 1024  # smartctl's stderr carries a line or two (an open error, a usage message)
CHUNK = 64 * 1024  # one read from a pipe: what a runaway process costs above the limit at most


class SmartctlTimeout(Exception):
    pass


class SmartctlOverflow(Exception):
    """smartctl printed more than ``STDOUT_LIMIT`` (or ``STDERR_LIMIT``): killed, its output thrown away."""


@dataclass
class Call:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


_LIVE: set[subprocess.Popen[bytes]] = set()  # smartctl processes running now: killed if the agent exits first
_LIVE_LOCK = threading.Lock()


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: a wrapper script's children too


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the run's process group and reap it. What is left in the pipes is not read: a grandchild that left
    the group could keep writing; closing our ends makes its writes fail instead."""
    _killpg(proc)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    # Stuck in the kernel (uninterruptible I/O on a sick disk), it dies when the I/O returns; subprocess reaps it
    # then. This thread does not wait for the disk.
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


@atexit.register
def _kill_live() -> None:
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for proc in procs:
        _killpg(proc)


def read_bounded(proc: subprocess.Popen[bytes], deadline: float, limits: tuple[int, int]) -> tuple[bytes, bytes]:
    """stdout and stderr of ``proc`` until both reach end of file, at most ``limits`` bytes each, in ``CHUNK`` reads
    (memory stays bounded however fast the child writes); then its exit. Raises ``SmartctlOverflow`` past a limit and
    ``subprocess.TimeoutExpired`` at ``deadline`` (``time.monotonic``); the caller kills the process group."""
    assert proc.stdout is not None and proc.stderr is not None
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    limit = dict(zip(bufs, limits, strict=True))
    with selectors.DefaultSelector() as sel:
        for pipe in (proc.stdout, proc.stderr):
            sel.register(pipe, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(proc.args, 0)
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fd]
                if len(buf) + len(chunk) > limit[key.fd]:
                    stream = "stdout" if key.fileobj is proc.stdout else "stderr"
                    raise SmartctlOverflow(f"more than {limit[key.fd] // 1024} KiB on {stream}")
                buf += chunk
    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    return bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()])


def run_smartctl(argv: list[str], timeout: float) -> Call:
    """One smartctl run: own process group, C locale for the child only, output read through ``STDOUT_LIMIT`` and
    ``STDERR_LIMIT``; the group is killed at ``timeout`` (``SmartctlTimeout``) or past a limit
    (``SmartctlOverflow``)."""
    env = {**os.environ, "LANG": "C", "LC_ALL": "C"}
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        out, err = read_bounded(proc, time.monotonic() + timeout, (STDOUT_LIMIT, STDERR_LIMIT))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise SmartctlTimeout(f"smartctl killed after {timeout:g}s: {' '.join(argv[1:])}") from None
    except SmartctlOverflow as exc:
        _kill_group(proc)
        raise SmartctlOverflow(f"smartctl killed: {exc}: {' '.join(argv[1:])}") from None
    except BaseException:  # not expected (a bug, an interrupt): never leave the child running
        _kill_group(proc)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()
    return Call(argv, proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


_IMPORT_LOCK = threading.RLock()


def import_pysmart() -> ModuleType:
    """Import pySMART with its process-wide side effects undone (LANG, the logger class)."""
    with _IMPORT_LOCK:
        module = sys.modules.get("pySMART")
        if module is not None:
            return module
        saved_lang = os.environ.get("LANG")
        saved_logger_class = logging.getLoggerClass()
        try:
            import pySMART  # noqa: F401  (the import is the point: it runs pySMART's module-level side effects)

            return sys.modules["pySMART"]
        finally:
            if saved_lang is None:
                os.environ.pop("LANG", None)
            else:
                os.environ["LANG"] = saved_lang
            logging.setLoggerClass(saved_logger_class)


@dataclass
class Edge:
    """pySMART's Smartctl and Device, with the edge replaced: built once, after the contained import."""

    smartctl: Callable[..., Any]
    device: Callable[..., Any]
    ata: Any  # pySMART.interface.AtaAttributes
    nvme: Any  # pySMART.interface.NvmeAttributes


_EDGE: Edge | None = None


def edge() -> Edge:
    """The edge, built on first use (raises ImportError when pySMART is not installed)."""
    global _EDGE
    with _IMPORT_LOCK:
        if _EDGE is None:
            _EDGE = _build_edge()
        return _EDGE


def _build_edge() -> Edge:
    import_pysmart()
    from pySMART.device import Device
    from pySMART.interface import AtaAttributes, NvmeAttributes
    from pySMART.smartctl import Smartctl

    class RecordingSmartctl(Smartctl):  # type: ignore[misc]
        """Every call: --nocheck=standby, a hard timeout with a group kill, recorded."""

        def __init__(self, path: str, timeout: float) -> None:
            super().__init__(smartctl_path=path, options=[NOCHECK])
            self.timeout = timeout
            self.calls: list[Call] = []
            self.timed_out = ""
            self.overflow = ""

        def generic_call(self, params: list[str], pass_options: bool = False) -> tuple[list[str], int]:
            return super().generic_call(params, pass_options=True)  # type: ignore[no-any-return]

        def _exec(self, cmd: list[str]) -> tuple[list[str], int]:
            try:
                call = run_smartctl([str(c) for c in cmd], self.timeout)
            except SmartctlTimeout as exc:
                self.timed_out = str(exc)  # pySMART swallows exceptions in places; the collector checks this
                raise
            except SmartctlOverflow as exc:
                self.overflow = str(exc)  # likewise
                raise
            self.calls.append(call)
            return call.stdout.splitlines(), call.returncode

    class HostDevice(Device):  # type: ignore[misc]
        """A Device whose smartctl argument is the node under devRoot, not pySMART's hard-wired /dev/<name>."""

        def __init__(self, name: str, path: str, interface: str | None, smartctl: Any) -> None:
            self._host_path = path
            super().__init__(name, interface=interface, smartctl=smartctl)

        @property
        def dev_reference(self) -> str:
            return self._host_path

    return Edge(RecordingSmartctl, HostDevice, AtaAttributes, NvmeAttributes)
