"""ReusableThread: one thread kept between jobs; a stuck job costs a new thread, not a wait, and threads end."""

from __future__ import annotations

import gc
import threading
import time
import weakref

from nvdaemon.worker_thread import ReusableThread

WAIT = 30.0  # a bound for waits on what is checked (a job ran, a thread ended); never reached when it works


def run(worker: ReusableThread) -> threading.Thread:
    """Run one job to its end in ``worker``; the thread that ran it."""
    ran: list[threading.Thread] = []
    done = threading.Event()

    def record() -> None:
        ran.append(threading.current_thread())
        done.set()

    worker.run_soon(record)
    assert done.wait(WAIT)
    return ran[0]


def start_stuck(worker: ReusableThread) -> tuple[threading.Thread, threading.Event]:
    """Start a job in ``worker`` that blocks until the returned event is set; the thread it blocks."""
    release, entered = threading.Event(), threading.Event()
    stuck: list[threading.Thread] = []

    def hang() -> None:
        stuck.append(threading.current_thread())
        entered.set()
        release.wait(WAIT)

    worker.run_soon(hang)
    assert entered.wait(WAIT)
    return stuck[0], release


def wait_free(worker: ReusableThread) -> None:
    """Until a thread of ``worker``'s waits for work."""
    deadline = time.monotonic() + WAIT
    while not worker.free():
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_jobs_one_after_another_share_one_thread() -> None:
    worker = ReusableThread("tier core")
    threads = [run(worker) for _ in range(5)]
    assert len(set(threads)) == 1 and worker.started == 1
    assert threads[0].name == "tier core" and threads[0].daemon


def test_a_stuck_job_gets_the_next_job_a_new_thread_and_its_thread_ends_once_it_returns() -> None:
    worker = ReusableThread("tier core")
    stuck, release = start_stuck(worker)
    second = run(worker)  # not held up by the stuck one
    assert second is not stuck and worker.started == 2
    assert run(worker) is second  # the free thread is the one reused
    release.set()
    stuck.join(WAIT)  # another thread is free: the one that was stuck ends instead of waiting for work
    assert not stuck.is_alive()
    assert run(worker) is second and worker.started == 2


def test_the_thread_that_was_stuck_is_kept_when_no_other_is_free() -> None:
    worker = ReusableThread("statfs local mounts")
    stuck, release = start_stuck(worker)
    # The job returns with no other thread started: its thread takes the next job.
    release.set()
    wait_free(worker)
    first = run(worker)
    assert worker.started == 1 and first is stuck and run(worker) is first


def test_an_idle_thread_ends_after_its_idle_time() -> None:
    worker = ReusableThread("tier core", idle_seconds=0.01)
    first = run(worker)
    first.join(WAIT)
    assert not first.is_alive()
    second = run(worker)  # a job after that gets a new thread
    assert second is not first and worker.started == 2


def test_what_a_finished_job_held_is_not_kept_by_the_idle_thread() -> None:
    class Payload:
        pass

    done = threading.Event()

    class Job:
        def __init__(self) -> None:
            self.payload = Payload()

        def __call__(self) -> None:
            done.set()

    worker = ReusableThread("tier core")
    job = Job()
    payload = weakref.ref(job.payload)
    worker.run_soon(job)
    assert done.wait(WAIT)
    del job
    wait_free(worker)  # the thread is back waiting for work, the job it ran no longer referenced
    assert payload() is None


def test_a_thread_ends_once_its_owner_is_gone() -> None:
    # A reload replaces a tier loop (and its collectors): the idle threads of the old ones end without waiting out
    # their idle time.
    worker = ReusableThread("tier core")
    thread = run(worker)
    wait_free(worker)
    del worker
    gc.collect()
    thread.join(WAIT)
    assert not thread.is_alive()


def test_a_stuck_thread_ends_when_its_job_returns_after_its_owner_is_gone() -> None:
    worker = ReusableThread("tier core")
    stuck, release = start_stuck(worker)
    del worker
    gc.collect()
    release.set()
    stuck.join(WAIT)
    assert not stuck.is_alive()


def test_threads_that_ended_leave_nothing_behind() -> None:
    # A tier whose interval is longer than the idle time starts a thread every tick: what it keeps per thread goes
    # with the thread.
    worker = ReusableThread("tier smart", idle_seconds=0.001)
    for _ in range(20):
        thread = run(worker)
        thread.join(WAIT)
        assert not thread.is_alive()
    assert worker.started == 20 and not worker._inboxes
