"""SIGTERM to ``nvdaemon run`` keeps the one shutdown deadline (``shutdownGraceSeconds``) whatever holds it up:

- a worker thread that never returns (the engine-state write blocked on a hung stateDir: its temporary file is a
  FIFO no one reads, so ``open`` waits for ever; trio cannot cancel a thread, and waits for it): the exit guard
  ends the process after the deadline and says so in the log, naming what was still running;
- hundreds of keep-alive clients asking for ``/metrics`` without a pause, and websocket clients of ``/v1/events``:
  the server drains from the SIGTERM on, side by side with the sinks' final work, not after it: while a history
  database another connection holds locked keeps the history flush waiting, the server closes every keep-alive
  client before the tasks' stop phase ends (the agent logs that end; the final engine-state write follows it). Then,
  the lock released, every client connection is closed by the server (the websockets with a 1001 close frame) and
  the process exits 0.

Exit times are measured and printed (``-s`` shows them), not asserted: machines are noisy.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_e2e import ROOT, Agent, free_port, wait_for

EXIT_BOUND = 60.0  # how long the test waits for the exit: a bound on failure only
STOPPED = "shutdown: tiers and sinks "  # the agent's log line once the tasks' stop phase has ended
CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: {grace}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  stream: {{enabled: true, maxClients: 1000}}
server: {{idleTimeoutSeconds: 300, headerTimeoutSeconds: 300}}
history: {{enabled: true, metrics: [load1]}}
rules:
  - {{metric: temp_celsius, device: hwmon0/coretemp/temp1, condition: cpu_package_hot,
     severity: critical, threshold: 95, op: ">="}}
"""


def make_agent(tmp_path: Path, grace: float) -> Agent:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", grace=grace, port=free_port()))
    return Agent(tmp_path, host, config)


@pytest.fixture
def agents() -> Iterator[list[Agent]]:
    made: list[Agent] = []
    yield made
    for agent in made:
        agent.kill()


def sigterm(agent: Agent) -> float:
    """SIGTERM, then wait (at most EXIT_BOUND) for the exit; the seconds it took."""
    assert agent.proc is not None
    began = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    return wait_exit(agent, began)


def wait_exit(agent: Agent, began: float) -> float:
    """Wait (at most EXIT_BOUND) for the exit of the agent signalled at ``began`` (time.monotonic()); the seconds
    from then."""
    assert agent.proc is not None
    try:
        agent.proc.wait(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {EXIT_BOUND:.0f}s after SIGTERM")
    return time.monotonic() - began


def file_id(path: Path) -> tuple[int, int]:
    """Which version of ``path`` this is: an atomic write (a new file renamed over it) changes both."""
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def hot_sensor(agent: Agent) -> Path:
    return next(
        p / "temp1_input"
        for p in (agent.host / "sys/class/hwmon").iterdir()
        if (p / "name").read_text() == "coretemp\n"
    )


@pytest.mark.e2e
def test_a_worker_thread_that_never_returns_does_not_hold_the_exit(tmp_path: Path, agents: list[Agent]) -> None:
    grace = 2.0
    agent = make_agent(tmp_path, grace)
    agents.append(agent)
    state = tmp_path / "state"
    agent.start()
    wait_for((state / "engine.json").exists, "engine.json written (cpu_package_hot ENTER)")
    os.mkfifo(state / ".engine.json.tmp")  # the next engine-state write blocks in open(): a hung disk
    hot_sensor(agent).write_text("60000\n")  # the EXIT makes the state dirty: the tier loop writes it, and hangs
    wait_for(
        lambda: any(
            "no completed tick" in p for p in json.loads(agent.get("/healthz")[1] or b"{}").get("problems", [])
        ),
        "the core tier stuck in its state write (/healthz)",
    )

    took = sigterm(agent)
    print(f"\nexit after {took:.2f}s with a thread stuck, shutdownGraceSeconds {grace}")
    log = (tmp_path / "agent.log").read_text()
    assert agent.proc is not None and agent.proc.returncode == 1, log[-2000:]
    line = next((li for li in log.splitlines() if "shutdown overran its deadline" in li), None)
    assert line is not None, log[-2000:]
    assert f"shutdownGraceSeconds {grace:g}s" in line and "exiting now with code 1" in line
    assert "atomic_write" in line  # what was still running, and where


class Clients:
    """``n_http`` keep-alive clients that ask for /metrics again as soon as an answer is complete, and ``n_ws``
    websocket clients of /v1/events, pumped by one thread until each is closed by the server."""

    def __init__(self, port: int, n_http: int, n_ws: int) -> None:
        self.port = port
        self.sel = selectors.DefaultSelector()
        self.closed: dict[socket.socket, float] = {}  # when the server closed it (time.monotonic())
        self.data: dict[socket.socket, bytearray] = {}
        self.http: list[socket.socket] = [self._http() for _ in range(n_http)]
        self.ws: list[socket.socket] = [self._ws() for _ in range(n_ws)]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _connect(self, request: bytes) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            assert chunk, "closed before answering"
            head += chunk
        sock.setblocking(False)
        self.data[sock] = bytearray(head.partition(b"\r\n\r\n")[2])
        self.sel.register(sock, selectors.EVENT_READ)
        return sock

    def _http(self) -> socket.socket:
        return self._connect(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")

    def _ws(self) -> socket.socket:
        key = base64.b64encode(os.urandom(16)).decode()
        return self._connect(
            (
                "GET /v1/events HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )

    def _pump(self) -> None:
        ws = set(self.ws)
        for sock in self.http:  # one request in flight on each, always
            sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        while not self.stop.is_set() and len(self.closed) < len(self.data):
            for key, _ in self.sel.select(0.05):
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                sock = conn
                try:
                    chunk = sock.recv(262144)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    self.closed[sock] = time.monotonic()
                    self.sel.unregister(sock)
                    continue
                self.data[sock] += chunk
                if sock not in ws and b"\r\n\r\n" in chunk:  # an answer began: ask again (pipelined)
                    with contextlib.suppress(OSError):
                        sock.send(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for sock in self.data:
            sock.close()


def write_lock(db: Path) -> sqlite3.Connection:
    con = sqlite3.connect(db, isolation_level=None, timeout=10, check_same_thread=False)
    con.execute("BEGIN IMMEDIATE")
    return con


@pytest.mark.e2e
def test_many_keep_alive_and_websocket_clients_are_closed_and_the_agent_exits(
    tmp_path: Path, agents: list[Agent]
) -> None:
    grace = 8.0
    agent = make_agent(tmp_path, grace)
    agents.append(agent)
    engine = tmp_path / "state" / "engine.json"
    agent.start()
    wait_for(lambda: json.loads(agent.get("/v1/status")[1])["sinks"]["history"]["open"], "the history store open")
    wait_for(engine.exists, "engine.json written (cpu_package_hot ENTER)")
    clients = Clients(agent.port, n_http=300, n_ws=30)
    lock: sqlite3.Connection | None = None
    try:
        wait_for(lambda: json.loads(agent.get("/v1/status")[1])["sinks"]["stream"]["clients"] == 30, "30 streams")
        saved = file_id(engine)  # no transition follows the ENTER: the next write is the shutdown's final persist
        # The sinks' final work is held while the test holds this lock: the history flush waits on it (up to
        # FINAL_FLUSH_SECONDS, the flush's own bound).
        lock = write_lock(tmp_path / "state" / "history.db")
        proc = agent.proc
        assert proc is not None
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        wait_for(
            lambda: all(s in clients.closed for s in clients.http) or proc.poll() is not None,
            lambda: (
                f"every keep-alive client closed ({sum(s in clients.closed for s in clients.http)} of 300) or the exit"
            ),
        )
        # The ordering the test is about, read once the server has closed the last keep-alive client: the drain did
        # not wait for the sinks. Their stop phase (the agent logs its end) and the final engine-state persist that
        # follows it have not happened yet: the lock still holds the history flush.
        log = (tmp_path / "agent.log").read_text()
        open_http = [s for s in clients.http if s not in clients.closed]
        assert not open_http, f"{len(open_http)} keep-alive client(s) still open at the exit: {log[-2000:]}"
        last_http = max(clients.closed[s] for s in clients.http) - began
        assert STOPPED not in log, f"the server closed its keep-alive clients only after the sinks: {log[-2000:]}"
        assert file_id(engine) == saved, "the final engine-state persist (after the sinks stopped) came first"
        lock.close()
        lock = None
        released = time.monotonic() - began
        took = wait_exit(agent, began)
        clients.thread.join(EXIT_BOUND)
    finally:
        if lock is not None:
            lock.close()
        clients.close()
    log = (tmp_path / "agent.log").read_text()
    assert proc.returncode == 0, log[-2000:]
    # (Every socket reads EOF once the process is gone, so "all closed" after the exit proves nothing: the
    # keep-alive clients were checked before it, above, and the streams by their 1001 close frames, below.)
    stop_line = next(li for li in log.splitlines() if STOPPED in li)
    print(
        f"\nlast keep-alive client closed {last_http:.2f}s after SIGTERM, the lock released at {released:.2f}s, "
        f"exit at {took:.2f}s (grace {grace}s); agent: {stop_line.partition(STOPPED)[2]}"
    )
    for sock in clients.ws:
        frames = bytes(clients.data[sock])
        close = frames.rfind(b"\x88")
        assert close >= 0 and frames[close + 2 : close + 4] == (1001).to_bytes(2, "big"), frames[-64:]
