"""The platform-connector socket's state in the log and the status: a streak of skipped sends (socket missing, or
something that is not a socket at its path) is logged once when it starts and once when it ends, never per send,
and a regular file or a directory at the path is named as such, not reported as a refused connection.

A real gRPC server on a Unix socket (tests/nvsentinel/connector.py); the reconciler's passes are driven directly.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio

from nvdaemon.sinks.nvsentinel.sink import Reconciler
from tests.nvsentinel.conftest import MakeReconciler
from tests.nvsentinel.connector import FakeConnector
from tests.nvsentinel.test_reconciler import HOT, HOT_CHECK, active, sync

LOGGER = "nvdaemon.sinks.nvsentinel"


def socket_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    """(level, message) of the sink's lines about the socket, in order."""
    return [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == LOGGER and "platform-connector socket" in r.getMessage()
    ]


async def passes(rec: Reconciler, n: int, *, hot: bool = True) -> None:
    for _ in range(n):
        await sync(rec, [active(HOT, 97.0)] if hot else [])


async def test_missing_socket_streaks_are_logged_once_at_start_and_once_at_end(
    connector: FakeConnector, make_reconciler: MakeReconciler, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)

    # Absent at start: 10 passes, 3 differences each (two baselines and the critical fault), 30 skipped sends.
    await passes(rec, 10)
    assert rec.skipped == 30
    lines = socket_lines(caplog)
    assert len(lines) == 1, lines
    level, text = lines[0]
    assert level == "ERROR"  # a fatal fault is among what NVSentinel does not hear of
    assert f"socket {socket_path}: missing" in text
    assert f"raise {HOT_CHECK}" in text and "(fatal)" in text
    assert "nvsentinel_health_events_publisher_skipped_pc_unavailable" in text
    state = rec.state()
    assert state["socketState"] == "missing" and state["socketPresent"] is False
    assert state["lastError"] == f"socket {socket_path}: missing"

    # It appears: one INFO line, and everything pending goes out.
    connector.start()
    await passes(rec, 3)
    lines = socket_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[1][0] == "INFO"
    assert f"socket {socket_path} is back" in lines[1][1] and "30 send(s) skipped" in lines[1][1]
    assert rec.pending == 0 and rec.state()["socketState"] == "present"

    # Removed again while a clear is due: a second streak, a WARNING this time (no fatal fault skipped).
    connector.stop()
    await passes(rec, 5, hot=False)
    lines = socket_lines(caplog)
    assert len(lines) == 3, lines
    assert lines[2][0] == "WARNING" and f"socket {socket_path}: missing" in lines[2][1]
    assert f"clear {HOT_CHECK}" in lines[2][1]
    back = FakeConnector(socket_path, "node-a", connector.token_file).start()
    try:
        await passes(rec, 2, hot=False)
    finally:
        back.stop()
    lines = socket_lines(caplog)
    assert len(lines) == 4 and lines[3][0] == "INFO" and "5 send(s) skipped" in lines[3][1], lines
    assert rec.skipped == 35 and rec.pending == 0
    cleared = back.condition(HOT_CHECK)
    assert cleared is not None and cleared["status"] == "False"


@pytest.mark.parametrize("kind", ["regular file", "directory"])
async def test_a_file_or_directory_at_the_socket_path_is_named_not_refused(
    make_reconciler: MakeReconciler,
    socket_path: Path,
    token_file: Path,
    caplog: pytest.LogCaptureFixture,
    kind: str,
) -> None:
    """A hostPath mounted before the platform-connector made its socket leaves a directory there; a stray file the
    same. Neither can be connected to: the sends are skipped as for a missing socket, and the log, ``socketState``
    and ``lastError`` say what is there."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    if kind == "directory":
        socket_path.mkdir()
    else:
        socket_path.touch()
    rec = make_reconciler(max_attempts=3, retry_initial_seconds=0.01)
    await trio.to_thread.run_sync(rec.load)
    await passes(rec, 4)
    assert rec.skipped == 12 and sum(rec.errors.values()) == 0  # nothing was attempted, so nothing "refused"
    state = rec.state()
    assert state["socketState"] == f"not a socket: {kind}"
    assert state["lastError"] == f"socket {socket_path}: not a socket: {kind}"
    lines = socket_lines(caplog)
    assert len(lines) == 1 and f"socket {socket_path}: not a socket: {kind}" in lines[0][1], lines
    assert not [r for r in caplog.records if "refused" in r.getMessage().lower()]

    # The platform-connector takes its path back (it removes what is there, then binds): one INFO line.
    if socket_path.is_dir():
        socket_path.rmdir()
    else:
        socket_path.unlink()
    connector = FakeConnector(socket_path, "node-a", token_file).start()
    try:
        await passes(rec, 2)
    finally:
        connector.stop()
    lines = socket_lines(caplog)
    assert len(lines) == 2 and lines[1][0] == "INFO" and f"(was not a socket: {kind})" in lines[1][1], lines
    assert rec.pending == 0 and rec.state()["socketState"] == "present"


async def test_what_is_at_the_path_changing_is_logged_as_it_changes(
    make_reconciler: MakeReconciler, socket_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Missing, then a directory: two lines (each names its own problem), not one per send."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await passes(rec, 3)
    socket_path.mkdir()
    await passes(rec, 3)
    lines = socket_lines(caplog)
    assert len(lines) == 2, lines
    assert f"{socket_path}: missing;" in lines[0][1] and f"{socket_path}: not a socket: directory;" in lines[1][1]
