"""The XID source: a long-lived supervised task that turns NVML XidCriticalError events into bus events.

It registers XidCriticalError on every GPU that supports it (a GPU that supports none is logged, not fatal), then
waits in a worker thread for at most ``xid_wait_ms`` at a time, so a cancellation is honoured within one wait. The
wait is never abandoned: on cancellation trio lets the thread return first, and only then is the event set freed
(shielded), so ``nvmlEventSetFree`` can never race a wait in flight.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from nvdaemon.gpu import GpuRuntime

log = logging.getLogger(__name__)

TASK_NAME = "source:xid"  # "source:" tasks stop with the tier loops, before the sinks flush


async def run_xid_source(rt: GpuRuntime, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    problems = await trio.to_thread.run_sync(rt.backend.xid_open, limiter=rt.limiter)
    try:
        for problem in problems:
            log.warning("xid: %s", problem)
        registered = rt.backend.xid_registered()
        log.info("xid: waiting for XID events on %d GPU(s)", registered)
        task_status.started()
        if registered == 0:
            await trio.sleep_forever()
        while True:
            # Not abandoned on cancel: the thread returns within one wait and only then does the loop end.
            notices = await trio.to_thread.run_sync(rt.backend.xid_wait, rt.xid_wait_ms, limiter=rt.limiter)
            if notices:
                rt.on_xids(notices)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(rt.backend.xid_close)


async def serve_xid(rt: GpuRuntime | None, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The supervised task: the XID source of the opened runtime; without one (no gpu tier) it ends at once."""
    if rt is None:
        task_status.started()
        return
    await run_xid_source(rt, task_status=task_status)
