"""The kernel-log source on this machine's real ``/dev/kmsg`` (the character device: non-blocking reads, poll), with a
kernel rule whose pattern holds a marker unique to the run. A line the test writes to ``/dev/kmsg`` is a process's
record: the kernel gives it the user facility (it refuses the kernel's to writers), and the source must read it and
skip it, counted, without an event: a process cannot fake a kernel fault into a drain.

Root only (writing to ``/dev/kmsg`` needs it, and reading it needs CAP_SYSLOG where ``kernel.dmesg_restrict`` is 1);
skipped, with the reason, when the device cannot be opened for reading or for writing (a container without it, a
device cgroup that refuses it). ``lookbackSeconds`` 0: the records logged before the source started are skipped by
their age (``/proc/uptime`` against each record's time since boot).
"""

from __future__ import annotations

import math
import os
import uuid
from pathlib import Path

import pytest
import trio

from nvdaemon.config import KernelLogConfig, KernelRule
from nvdaemon.engine import EngineState, draw_seq
from nvdaemon.gpu.xid_ledger import XidLedger
from nvdaemon.kmsg.position import POSITION_FILE
from nvdaemon.kmsg.rules import compile_rules
from nvdaemon.kmsg.source import KmsgSource
from nvdaemon.model import Event
from tests.polling import until

KMSG = Path("/dev/kmsg")


def _unopenable(flags: int) -> str:
    """Why ``/dev/kmsg`` cannot be opened with ``flags`` ("" when it can)."""
    try:
        os.close(os.open(KMSG, flags | os.O_NONBLOCK | os.O_CLOEXEC))
    except OSError as exc:
        return f"{KMSG} cannot be opened: {exc.strerror or exc}"
    return ""


def skip_reason() -> str:
    if os.geteuid() != 0:
        return "not running as root: writing to /dev/kmsg (and reading it under dmesg_restrict) needs root"
    return _unopenable(os.O_RDONLY) or _unopenable(os.O_WRONLY)


pytestmark = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "-")


def marker_seq(fd: int, marker: str) -> int:
    """The sequence number of the record holding ``marker``, read on ``fd`` (opened at the end of the log before the
    marker was written)."""
    while True:
        try:
            raw = os.read(fd, 8192)
        except BlockingIOError:
            raise AssertionError(f"the marker {marker} is not in the kernel log") from None
        except BrokenPipeError:
            continue  # records overwritten meanwhile: the next read goes on from the oldest left
        header, _, message = raw.partition(b";")
        if marker.encode() in message:
            prio, seq = header.split(b",")[:2]
            assert int(prio) >> 3 != 0, f"a process's record with the kernel's facility: {raw!r}"
            return int(seq)


async def test_a_line_a_process_writes_to_dev_kmsg_is_read_and_skipped(tmp_path: Path) -> None:
    marker = uuid.uuid4().hex
    rule = KernelRule(pattern=f"nvdaemon-test {marker} (?P<what>\\w+)", condition="nvdaemon_test_marker")
    cfg = KernelLogConfig(lookback_seconds=0.0, default_rules=False)
    state = EngineState()
    events: list[Event] = []

    async def persist_engine() -> None:
        pass

    ledger = XidLedger(node="real-node", emit=events.extend, next_seq=lambda: draw_seq(state))
    source = KmsgSource(
        cfg,
        compile_rules([rule], defaults=False),
        path=KMSG,
        position_path=tmp_path / POSITION_FILE,
        boot_id_path=Path("/proc/sys/kernel/random/boot_id"),
        uptime_path=Path("/proc/uptime"),
        node="real-node",
        state=lambda: state,
        emit=events.extend,
        ledger=ledger,
        persist_engine=persist_engine,
        held_seq=lambda: math.inf,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(source.serve)
        assert source.up and source.reader.device, source.status()
        tail = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.lseek(tail, 0, os.SEEK_END)
            fd = os.open(KMSG, os.O_WRONLY | os.O_CLOEXEC)
            try:
                # "<4>" asks for the kernel's facility (0) at warning level; the kernel makes it the user facility.
                os.write(fd, f"<4>nvdaemon-test {marker} written by the test suite\n".encode())
            finally:
                os.close(fd)
            seq = marker_seq(tail, marker)
        finally:
            os.close(tail)
        await until(
            lambda: source.last_seq >= seq, lambda: f"the record {seq} read; the source: {source.status()}", timeout=30
        )
        nursery.cancel_scope.cancel()
    assert events == []
    assert source.counters.matches["nvdaemon_test_marker"] == 0
    assert source.counters.skipped["userspace"] >= 1  # the marker's record (and any other process's meanwhile)
    assert source.counters.skipped["lookback"] > 0  # the records the ring buffer held before the start
    assert (tmp_path / POSITION_FILE).exists()  # saved on the way out, for the boot this machine runs
