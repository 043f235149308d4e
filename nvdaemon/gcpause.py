"""Automatic garbage collection paused while a tier's worker thread reads and parses, resumed when it hands back.

A core tick with the node_* surface allocates some 2,200 container objects at its peak in the worker thread (a text
per file, a parse per text, the families) and frees them by reference counting: ``bench/tick.py`` counts what ten
ticks leave to the cycle collector, and it is none. CPython collects its youngest generation every 700 net
allocations all the same, so the collector walked the batch's live objects three times a tick and found nothing:
0.6 ms of each 15 s cycle in the running agent on gpunode (``gc.callbacks`` in the worker thread: 3.2 young and 0.3
middle collections a cycle, against 0.02 ms on the loop). Paused for the batch, the objects still alive when it
ends are walked once, at the first collection after it.

Only the loop pauses and resumes (``paused``), so a read that hangs cannot keep collection off: the loop gives up on
the batch at its deadline and resumes it then. Pauses of several tiers nest; collection resumes when the last one
ends, and only if it was on when the first began (a caller that turned it off itself keeps it off).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0
_resume = False  # collection was on when the outermost pause began


@contextmanager
def paused() -> Iterator[None]:
    """Automatic collection off for the block (nested pauses count), then back to how the outermost found it."""
    global _pauses, _resume
    with _lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()
