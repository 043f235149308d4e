"""The soak's accounting check on hand-made records (the full soak is ``test_soak.py``)."""

from __future__ import annotations

from bench.soak.receiver import Receipt
from bench.soak.verdict import LoggedEvent, check_accounting


def logged(*ids: str) -> list[LoggedEvent]:
    return [LoggedEvent(1, n, i, n + 1, "load_high", "cpu", "ENTER", "warning") for n, i in enumerate(ids)]


def acked(*ids: str) -> list[Receipt]:
    return [Receipt(float(n), i, "200", 1) for n, i in enumerate(ids)]


FINAL = {"sinks": {"webhook:x": {"dropped": {"spool_corrupt": 1}}}}


def test_every_event_delivered_or_dropped_once_passes() -> None:
    check = check_accounting(logged("a", "b"), acked("a"), {1: {"b": "spool_corrupt"}}, {"a", "b"}, FINAL)
    assert check.ok, check.figures


def test_an_event_both_delivered_and_counted_as_dropped_fails() -> None:
    check = check_accounting(logged("a", "b"), acked("a", "b"), {1: {"b": "spool_corrupt"}}, {"a", "b"}, FINAL)
    assert not check.ok and "1 both delivered and counted as dropped" in check.figures


def test_an_event_neither_delivered_nor_dropped_fails() -> None:
    check = check_accounting(logged("a", "b"), acked("a"), {1: {}}, {"a", "b"}, {"sinks": {}})
    assert not check.ok and "1 unexplained" in check.figures
