"""The XID source: a long-lived supervised task that turns NVML XidCriticalError events into bus events.

It registers XidCriticalError on every GPU that supports it (a GPU that supports none is logged, not fatal), then
waits in a worker thread for at most ``xid_wait_ms`` at a time, so a cancellation is honoured within one wait. The
thread goes on to the next wait by itself while none came (``trio.from_thread.check_cancelled`` between waits, no
trip through the event loop): an idle node costs no loop wakeup per wait, only one per batch of XIDs. The
wait is never abandoned: on cancellation trio lets the thread return first, and only then is the event set freed
(shielded), so ``nvmlEventSetFree`` can never race a wait in flight.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from nvdaemon.gpu import GpuRuntime
    from nvdaemon.nvml import NvmlBackend, XidNotice

log = logging.getLogger(__name__)

TASK_NAME = "source:xid"  # "source:" tasks stop with the tier loops, before the sinks flush


def wait_for_xids(backend: NvmlBackend, wait_ms: int) -> list[XidNotice]:
    """In the worker thread: wait ``wait_ms`` at a time until XIDs come; raises ``trio.Cancelled`` between waits
    once the task that started it is cancelled."""
    while True:
        notices = backend.xid_wait(wait_ms)
        if notices:
            return notices
        trio.from_thread.check_cancelled()


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
        rt.ledger.live.add("nvml")  # the kernel log's reports wait for NVML's (merged into one event)
        while True:
            # Not abandoned on cancel: the thread returns within one wait and only then does the loop end.
            notices = await trio.to_thread.run_sync(wait_for_xids, rt.backend, rt.xid_wait_ms, limiter=rt.limiter)
            rt.on_xids(notices)
    finally:
        rt.ledger.live.discard("nvml")
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(rt.backend.xid_close)


async def serve_xid(rt: GpuRuntime | None, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The supervised task: the XID source of the opened runtime; without one (no gpu tier) it ends at once."""
    if rt is None:
        task_status.started()
        return
    await run_xid_source(rt, task_status=task_status)
