"""A worker thread kept between jobs: a tier loop hands its reads to the same thread every tick.

Starting a thread is not free: on this project's 2-CPU test VM a ``threading.Thread`` started, run and joined once
every 0.2 s cost 330-370 us of process CPU (caches cold between ticks), against 45-60 us to hand the same job to a
thread that waits on a queue. Trio's own thread cache lets an idle worker go after 10 s, so a 15 s tier tick started
a new thread every time, and the file system collector started one more per tick for its statfs batch.

A job that never returns (a read hung on sick hardware) keeps its thread: the next job gets a new one, and the stuck
thread, once its job returns, waits for work only if no other thread does, else it ends. So the threads are one plus
those stuck in a job, which the callers already bound (a collector whose read is still stuck is not read again).
An idle thread ends after ``idle_seconds`` without work (a tier removed by a reload leaves nothing behind for long);
waiting costs no CPU: it blocks on a lock, with no periodic wakeup.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

IDLE_SECONDS = 600.0  # far above any tier interval a node runs (15 s by default), so a tier never pays a new thread


class ReusableThread:
    """Runs each job given to ``run_soon`` in a thread of its own, reusing the thread that ran the previous one
    when it is free. Jobs must catch what they raise (as ``trio.lowlevel.start_thread_soon``'s deliver does)."""

    def __init__(self, name: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._idle: queue.SimpleQueue[Callable[[], None]] | None = None  # the free thread's inbox
        self.started = 0  # threads started (a job that found no free thread)

    def free(self) -> bool:
        """Whether a thread waits for work (the next job reuses it)."""
        with self._lock:
            return self._idle is not None

    def run_soon(self, job: Callable[[], None]) -> None:
        """Start ``job`` in the free thread, or in a new one when there is none (never waits for a busy one)."""
        with self._lock:
            inbox, self._idle = self._idle, None
            if inbox is None:
                self.started += 1
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name=self.name, daemon=True).start()
        inbox.put(job)

    def _serve(self, inbox: queue.SimpleQueue[Callable[[], None]]) -> None:
        job = inbox.get()  # put right after the start, by the caller that started this thread
        while True:
            job()
            del job  # what the job holds is not kept alive by an idle thread
            with self._lock:
                if self._idle is not None:  # another thread is already free (this one was stuck): end
                    return
                self._idle = inbox
            try:
                job = inbox.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._lock:
                    if self._idle is inbox:  # nobody took this thread in the meantime: end
                        self._idle = None
                        return
                job = inbox.get()  # a caller took it just as the wait ended: its job is on the way
