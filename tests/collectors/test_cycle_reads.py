"""The per-cycle cache: a file read once and a parse computed once, whichever collectors ask, errors included."""

from __future__ import annotations

import contextvars
import gc
import threading
import weakref
from pathlib import Path

import pytest

from nvdaemon.collectors.base import CYCLE_READS, CycleReads, NotPresent, read_parsed, read_text


def test_read_and_parse_once_per_cycle_across_threads(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    path.write_text("cpu 1 2 3\n")
    calls: list[str] = []

    def parse(text: str, where: str) -> list[str]:
        calls.append(where)
        return text.split()

    reads = CycleReads()
    token = CYCLE_READS.set(reads)
    try:
        results: list[list[str]] = []

        # Each thread runs in a copy of this context, as Trio's worker threads do.
        def ask() -> None:
            results.append(read_parsed(path, parse))

        threads = [threading.Thread(target=contextvars.copy_context().run, args=(ask,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert read_text(path) == "cpu 1 2 3\n"
    finally:
        CYCLE_READS.reset(token)
    assert results == [["cpu", "1", "2", "3"]] * 4
    assert calls == [str(path)]  # parsed once, for all four
    assert (reads.reads, reads.shared) == (1, 1)  # read once; the plain read_text was answered from the cache
    path.write_text("changed\n")
    assert read_parsed(path, parse) == ["changed"]  # outside a cycle nothing is cached


def test_errors_are_shared_too(tmp_path: Path) -> None:
    def parse(text: str, where: str) -> str:
        raise AssertionError("never reached: the file is missing")

    token = CYCLE_READS.set(CycleReads())
    try:
        for _ in range(2):
            with pytest.raises(NotPresent):
                read_parsed(tmp_path / "missing", parse)
    finally:
        CYCLE_READS.reset(token)


def test_a_closed_cycle_goes_by_reference_counting(tmp_path: Path) -> None:
    """An error shared by two readers holds no frame once the cycle is closed, so nothing keeps the cache alive in
    a reference cycle (the garbage collector is off here: only reference counting frees it)."""
    gc.disable()
    try:
        reads = CycleReads()
        gone = weakref.ref(reads)
        token = CYCLE_READS.set(reads)
        try:
            for _ in range(2):  # the owner, then a reader answered from the cache
                with pytest.raises(NotPresent) as raised:
                    read_text(tmp_path / "missing")
                assert raised.value.__traceback__ is not None  # a reader's own traceback, while it handles it
            del raised
        finally:
            CYCLE_READS.reset(token)
        reads.close()
        del reads
        assert gone() is None
    finally:
        gc.enable()
