"""End to end: SIGTERM to ``nvdaemon run`` with every sink configured and each one stalling keeps the one shutdown
deadline (``shutdownGraceSeconds``): the process exits 0 within it and the final engine-state persist still runs.

The stalls are real, made from outside the process:

- two webhook endpoints whose receiver takes the request and never answers, and whose spool another connection
  holds the write lock of (a disk that does not take writes for a while) when the last event arrives: both
  endpoints' ingest waits on it, and the test lets go of it ``SPOOL_STALL`` seconds after the SIGTERM;
- a websocket client of the event stream that completes the upgrade, then never reads nor answers the close;
- a history database another connection holds the write lock of for the whole test: the final flush waits on it
  until its bound;
- an NVSentinel platform-connector whose calls never return.

Sinks stopped one after another (the old shutdown) need the spool stall plus the history flush's bound, more than
the grace: the root deadline then cut the stop and skipped the final persist. ``engine.json`` is removed just before
the SIGTERM, while the locked spool keeps the running agent from saving it, so it exists afterwards only if the final
persist ran, and then holds the last event's seq (which the spool holds by then).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.nvsentinel.connector import FakeConnector
from tests.nvsentinel.e2e import agent_with_connector
from tests.test_e2e import Agent, events, wait_for

GRACE = 6.0
SPOOL_STALL = 4.0  # > GRACE / 2 (the history flush's old bound): the old sequential stop overran the grace
START_SLACK = 5.0  # process start and exit on a loaded machine: a generous bound, not a timing assertion

CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: {grace}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  stream: {{enabled: true}}
  webhook:
    - {{url: "http://127.0.0.1:{hang}/a", timeoutSeconds: 60}}
    - {{url: "http://127.0.0.1:{hang}/b", timeoutSeconds: 60}}
  nvsentinel: {{enabled: true, socketPath: {socket}, tokenPath: {token}, callTimeoutSeconds: 60}}
history: {{enabled: true, metrics: [load1]}}
rules:
  - {{metric: load1, device: cpu, condition: load_high, threshold: 16, enterFor: 2, exitFor: 2}}
  - {{metric: temp_celsius, device: hwmon0/coretemp/temp1, condition: cpu_package_hot,
     severity: critical, threshold: 95, op: ">="}}
"""


class HangingReceiver:
    """Takes connections and reads what comes, never answers (a receiver stuck behind a dead backend)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port: int = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if conn.recv(65536):
                self.requests += 1
            while conn.recv(65536):
                pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def stalled_stream_client(port: int) -> socket.socket:
    """A websocket client of ``/v1/events`` that completes the upgrade, then never reads nor answers the close."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        (
            "GET /v1/events?replay=1000 HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        assert chunk, "the server closed the websocket upgrade"
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def write_lock(db: Path) -> sqlite3.Connection:
    """Another connection holding ``db``'s write lock: the agent's writes wait on it (their busy timeout is 30 s)."""
    con = sqlite3.connect(db, isolation_level=None, timeout=10, check_same_thread=False)
    con.execute("BEGIN IMMEDIATE")
    return con


def engine_seq(path: Path) -> int | None:
    try:
        seq: int = json.loads(path.read_bytes())["seq"]
    except (FileNotFoundError, ValueError, KeyError):
        return None
    return seq


def sinks(agent: Agent) -> dict[str, Any]:
    doc: dict[str, Any] = agent.status()["sinks"]
    return doc


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[Agent, FakeConnector, HangingReceiver]]:
    hang = HangingReceiver()
    try:
        for agent, connector in agent_with_connector(tmp_path, "faulty", CONFIG, grace=GRACE, hang=hang.port):
            yield agent, connector, hang
    finally:
        hang.close()


@pytest.mark.e2e
def test_sigterm_with_every_sink_stalling_exits_within_grace_after_the_final_persist(
    setup: tuple[Agent, FakeConnector, HangingReceiver], tmp_path: Path
) -> None:
    agent, connector, hang = setup
    released, stalled = threading.Event(), threading.Event()

    def stall() -> None:  # the connector takes the call and answers it only when the test ends
        stalled.set()
        released.wait(60)

    connector.script.extend([stall] * 100)
    state = tmp_path / "state"
    engine_json = state / "engine.json"
    webhooks = [f"webhook:127.0.0.1:{hang.port}", f"webhook:127.0.0.1:{hang.port}#1"]
    locks: list[sqlite3.Connection] = []

    def spool_writable() -> None:
        locks[0].rollback()

    unlock = threading.Timer(SPOOL_STALL, spool_writable)
    client: socket.socket | None = None
    try:
        agent.start()
        wait_for(lambda: events(agent, "load_high", "ENTER") and events(agent, "cpu_package_hot", "ENTER"), "ENTERs")
        before = agent.status()["eventSeq"]
        wait_for(lambda: engine_seq(engine_json) == before, "engine.json saved with the ENTERs")
        wait_for(lambda: hang.requests >= 2, "both webhook endpoints waiting on the receiver")
        wait_for(stalled.is_set, "a call the connector does not answer")
        wait_for(lambda: sinks(agent)["history"]["open"], "the history store open")
        client = stalled_stream_client(agent.port)
        wait_for(lambda: sinks(agent)["stream"]["clients"] == 1, "the stream client connected")

        # The spool stops taking writes; then the sensor cools and the EXIT reaches both endpoints, which cannot
        # spool it: from here the running agent cannot save engine.json (it waits for the spool).
        locks.append(write_lock(state / "spool.db"))
        hwmon = next(p for p in (agent.host / "sys/class/hwmon").iterdir() if (p / "name").read_text() == "coretemp\n")
        (hwmon / "temp1_input").write_text("60000\n")
        last = wait_for(lambda: events(agent, "cpu_package_hot", "EXIT"), "cpu_package_hot EXIT")[0]["seq"]
        wait_for(lambda: all(sinks(agent)[w]["unspooled"] >= 1 for w in webhooks), "the EXIT waiting on the spool")
        assert last > before and engine_seq(engine_json) == before  # not saved past what the spool lacks

        locks.append(write_lock(state / "history.db"))
        engine_json.unlink()
        unlock.start()  # the spool takes writes again SPOOL_STALL seconds after the SIGTERM
        code, took = agent.stop()
    finally:
        unlock.cancel()
        with contextlib.suppress(RuntimeError):  # never started
            unlock.join()
        released.set()
        for lock in locks:
            with contextlib.suppress(sqlite3.Error):
                lock.close()
        if client is not None:
            client.close()

    assert code == 0
    assert took < GRACE + START_SLACK
    # The final persist ran although every sink overran its share: engine.json is back, with the last seq.
    assert engine_seq(engine_json) == last
    assert "stopped" in (tmp_path / "agent.log").read_text()
