"""A worker thread kept between jobs: a tier loop hands its reads to the same thread every tick.

Starting a thread is not free: on this project's 2-CPU test VM a ``threading.Thread`` started, run and joined once
every 0.2 s cost 330-370 us of process CPU (caches cold between ticks), against 45-60 us to hand the same job to a
thread that waits on a queue. Trio's own thread cache lets an idle worker go after 10 s, so a 15 s tier tick started
a new thread every time, and the file system collector started one more per tick for its statfs batch.

A job that never returns (a read hung on sick hardware) keeps its thread: the next job gets a new one, and the stuck
thread, once its job returns, waits for work only if no other thread does, else it ends. So the threads are one plus
those stuck in a job, which the callers already bound (a collector whose read is still stuck is not read again).
An idle thread ends after ``idle_seconds`` without work, and at once when its ``ReusableThread`` is gone (a reload
that replaces a tier loop or its collectors leaves no thread behind: the thread holds its owner only weakly). Waiting
costs no CPU: it blocks on a lock, with no periodic wakeup.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable

IDLE_SECONDS = 600.0  # far above any tier interval a node runs (15 s by default), so a tier never pays a new thread

Inbox = queue.SimpleQueue[Callable[[], None] | None]  # None: the owner is gone, end


class ReusableThread:
    """Runs each job given to ``run_soon`` in a thread of its own, reusing the thread that ran the previous one
    when it is free. Jobs must catch what they raise (as ``trio.lowlevel.start_thread_soon``'s deliver does)."""

    def __init__(self, name: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        self._idle: Inbox | None = None  # the free thread's inbox
        self.started = 0  # threads started (a job that found no free thread)
        # Every live thread's inbox (each thread removes its own as it ends): told to end when this object goes.
        self._inboxes: set[Inbox] = set()
        weakref.finalize(self, _end_all, self._inboxes)

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
            self._inboxes.add(inbox)
            args = (weakref.ref(self), inbox, self.idle_seconds, self._inboxes)
            threading.Thread(target=_serve, args=args, name=self.name, daemon=True).start()
        inbox.put(job)

    def _park(self, inbox: Inbox) -> bool:
        """After a job: this thread becomes the free one, or False when another already is (it was stuck: end)."""
        with self._lock:
            if self._idle is not None:
                return False
            self._idle = inbox
            return True

    def _retire(self, inbox: Inbox) -> bool:
        """After an idle wait timed out: True when nobody took this thread meanwhile (it ends)."""
        with self._lock:
            if self._idle is inbox:
                self._idle = None
                return True
            return False


def _end_all(inboxes: set[Inbox]) -> None:
    for inbox in list(inboxes):  # a copy: a thread ending meanwhile removes its own
        inbox.put(None)


def _serve(owner: weakref.ref[ReusableThread], inbox: Inbox, idle_seconds: float, inboxes: set[Inbox]) -> None:
    try:
        _jobs(owner, inbox, idle_seconds)
    finally:
        inboxes.discard(inbox)


def _jobs(owner: weakref.ref[ReusableThread], inbox: Inbox, idle_seconds: float) -> None:
    job = inbox.get()  # put right after the start, by the caller that started this thread
    while job is not None:
        job()
        del job  # what the job holds is not kept alive by an idle thread
        thread = owner()
        if thread is None or not thread._park(inbox):
            return
        del thread  # only the weak reference while waiting: the owner can go, and its finalizer wakes this thread
        try:
            job = inbox.get(timeout=idle_seconds)
        except queue.Empty:
            thread = owner()
            if thread is None or thread._retire(inbox):
                return
            del thread
            job = inbox.get()  # a caller took this thread just as the wait ended: its job is on the way
