"""What the agent costs when its peers misbehave (issue 26's hostile peers): peak RSS against 96 MiB (three quarters
of the chart's ``limits: {memory: 128Mi}``) and seconds from SIGTERM to exit against ``shutdownGraceSeconds`` plus
a 0.5 s margin. Each figure is ``nvdaemon run`` as a subprocess; RSS is its VmHWM (/proc/<pid>/status), never its
children's. The reference column is the same agent with a well-behaved peer, measured in the same run.

- ``webhook``: the core tier on a copy of ``fixtures/hosts/faulty``, one webhook, ``load_high`` entering and
  exiting as /proc/loadavg is flipped, until DELIVERIES events were answered by a loopback receiver (a stdlib
  http.server thread) that answers 200 with a 100 MB body, or 200 with a gzip bomb (BOMB_MIB MiB of zeros,
  ~256 KiB on the wire, ``Content-Encoding: gzip``); reference: a receiver answering ``ok``;
- ``smart``: the smart tier over ``fixtures/hosts/disks``'s four disks with a smartctl whose ``--all`` prints
  200 MB (anything else is answered by the stand-in ``fixtures/smartctl/smartctl``), SMART_GATHERS gathers, then
  SIGTERM (the chart's 10 s grace); reference: the stand-in itself;
- ``shutdown``: 500 busy keep-alive /metrics clients and 50 /v1/events clients, ``shutdownGraceSeconds: 2``
  (bench/hostile_clients.py);
- ``tick``: the core tier with ``nodeExporter.enabled`` on a copy of ``fixtures/hosts/healthy`` whose loadavg,
  stat, meminfo, vmstat and schedstat hold a 4 MB line, TICKS ticks; reference: the unpoisoned copy.

``python -m bench hostile`` (``make bench ARGS=hostile``) runs these alone; ``python -m bench.hostile`` prints the
raw figures too.
"""

from __future__ import annotations

import json
import signal
import stat
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import FIXTURES, SECRET, AgentProcess, BenchError, copy_host, get, peak_rss_kib
from bench.table import Row, Target

RSS_TARGET = Target("value", "<=", 96.0, "3/4 of the chart's 128Mi")
DELIVERIES = 20  # answered webhook deliveries per receiver
HUGE_BYTES = 100 * 1000 * 1000
BOMB_MIB = 256
SMART_GATHERS = 10
SMART_GRACE = 10.0  # deploy/chart/values.yaml's shutdownGraceSeconds
SMART_PRINTS = 200 * 1024 * 1024  # bytes the hostile smartctl prints for --all
LINE_BYTES = 4_000_000  # the one line each poisoned host file holds
TICKS = 30
WAIT = 120.0  # a bound on failure only: each wait returns once what it waits for happened
LOADAVG = {True: "24.51 18.32 9.87 27/1310 223344\n", False: "0.10 0.20 0.30 1/1310 223344\n"}


def _gzip_bomb() -> bytes:
    """BOMB_MIB MiB of zeros, gzip-compressed a MiB at a time (never held inflated here)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = bytes(1 << 20)
    return b"".join([*(z.compress(block) for _ in range(BOMB_MIB)), z.flush()])


class AnswerServer:
    """A loopback webhook receiver in a thread answering every POST with 200 and ``mode``'s body: ``huge`` (100 MB,
    written until the agent hangs up), ``bomb`` (the gzip bomb) or ``ok``. ``ids`` holds the events' ``webhook-id``s."""

    def __init__(self, mode: str) -> None:
        self.ids: set[str] = set()
        bomb = _gzip_bomb() if mode == "bomb" else b""
        self.wire_bytes = len(bomb)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                server.ids.add(self.headers.get("webhook-id", ""))  # a retry repeats its event's id
                self.send_response(200)
                body, length = (bomb, len(bomb)) if mode == "bomb" else (b"ok", 2)
                if mode == "bomb":
                    self.send_header("content-encoding", "gzip")
                if mode == "huge":
                    length = HUGE_BYTES
                self.send_header("content-length", str(length))
                self.end_headers()
                try:
                    if mode == "huge":
                        block = bytes(1 << 20)
                        for _ in range(HUGE_BYTES // len(block)):
                            self.wfile.write(block)
                        self.wfile.write(bytes(HUGE_BYTES % len(block)))
                    else:
                        self.wfile.write(body)
                except OSError:  # the agent hung up after the part it wanted
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                if not isinstance(sys.exc_info()[1], OSError):  # the agent hanging up mid-answer is the point
                    super().handle_error(request, client_address)

        self.http = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/hooks"

    @contextmanager
    def running(self) -> Iterator[AnswerServer]:
        thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.http.shutdown()
            self.http.server_close()


def wait_for(check: Callable[[], bool], what: str, agent: AgentProcess) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not after {WAIT:g}s\n{agent.log_tail()}")
        time.sleep(0.1)


def ticks(agent: AgentProcess, tier: str) -> int:
    """The tier's completed ticks, as /healthz reports them."""
    count: int = json.loads(get(agent.url + "/healthz")[1]).get("ticks", {}).get(tier, 0)
    return count


def webhook_peak(mode: str) -> tuple[float, int]:
    """Peak RSS (MiB) after DELIVERIES answered deliveries to a receiver answering ``mode``; the bomb's wire size."""
    with tempfile.TemporaryDirectory(prefix="nvdaemon-hostile-") as tmp, AnswerServer(mode).running() as rx:
        host = copy_host("faulty", Path(tmp))
        config: dict[str, Any] = {
            "node": "bench-node",
            "tiers": ["core"],
            "intervalSeconds": 0.2,
            "rules": [{"metric": "load1", "device": "cpu", "condition": "load_high", "threshold": 16}],
            "sinks": {"webhook": [{"url": rx.url, "secret": SECRET, "timeoutSeconds": 30}]},
        }
        with AgentProcess(config, host) as agent:
            high = True
            deadline = time.monotonic() + WAIT
            while len(rx.ids) < DELIVERIES:  # each flip is an ENTER or an EXIT: one delivery
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"webhook {mode}: {len(rx.ids)} of {DELIVERIES} events answered\n{agent.log_tail()}"
                    )
                high = not high
                (host / "proc" / "loadavg").write_text(LOADAVG[high])
                time.sleep(0.4)
            return peak_rss_kib(agent.pid) / 1024, rx.wire_bytes


HOSTILE_SMARTCTL = """#!/bin/sh
# --all prints {prints} bytes of 100-column lines; anything else is answered by the stand-in
for a in "$@"; do
  if [ "$a" = "--all" ]; then
    head -c {prints} /dev/zero | tr '\\0' x | fold -w 100
    exit 0
  fi
done
exec {standin} "$@"
"""


def smart_run(hostile: bool) -> tuple[float, float, int]:
    """Peak RSS (MiB) after SMART_GATHERS gathers over four disks, seconds from SIGTERM to exit, and how many
    smartctl runs killed at the output limit the agent's log names."""
    standin = FIXTURES / "smartctl" / "smartctl"
    with tempfile.TemporaryDirectory(prefix="nvdaemon-hostile-") as tmp:
        smartctl = standin
        if hostile:
            smartctl = Path(tmp) / "smartctl"
            smartctl.write_text(HOSTILE_SMARTCTL.format(prints=SMART_PRINTS, standin=standin))
            smartctl.chmod(smartctl.stat().st_mode | stat.S_IXUSR)
        config: dict[str, Any] = {
            "node": "bench-node",
            "tiers": ["smart"],
            "shutdownGraceSeconds": SMART_GRACE,
            "smart": {"smartctlPath": str(smartctl), "intervalSeconds": 1, "timeoutSeconds": 60},
        }
        with AgentProcess(config, FIXTURES / "hosts" / "disks") as agent:
            wait_for(lambda: ticks(agent, "smart") >= SMART_GATHERS, f"{SMART_GATHERS} SMART gathers", agent)
            peak = peak_rss_kib(agent.pid) / 1024
            assert agent.proc is not None
            began = time.monotonic()
            agent.proc.send_signal(signal.SIGTERM)
            agent.proc.wait(timeout=SMART_GRACE + 30)
            took = time.monotonic() - began
            # Killed runs the log names (a repeated warning is logged once): 0 means --all was never asked for.
            killed = agent.log_path.read_text(errors="replace").count("smartctl killed")
            return peak, took, killed


def poison(host: Path) -> None:
    """One LINE_BYTES line in loadavg, vmstat and schedstat (whole), and appended to stat and meminfo."""
    proc = host / "proc"
    line = (b"12 " * (LINE_BYTES // 3 + 1))[:LINE_BYTES]
    for name in ("loadavg", "vmstat", "schedstat"):
        (proc / name).write_bytes(line + b"\n")
    (proc / "stat").write_bytes((proc / "stat").read_bytes() + b"intr2 " + line + b"\n")
    (proc / "meminfo").write_bytes((proc / "meminfo").read_bytes() + b"Big: " + line + b"\n")


def tick_peak(poisoned: bool) -> float:
    """Peak RSS (MiB) after TICKS core ticks with the node_exporter surface."""
    with tempfile.TemporaryDirectory(prefix="nvdaemon-hostile-") as tmp:
        host = copy_host("healthy", Path(tmp))
        if poisoned:
            poison(host)
        config = {"node": "bench-node", "tiers": ["core"], "intervalSeconds": 0.25, "nodeExporter": {"enabled": True}}
        with AgentProcess(config, host) as agent:
            wait_for(lambda: ticks(agent, "core") >= TICKS, f"{TICKS} core ticks", agent)
            get(agent.url + "/metrics")
            return peak_rss_kib(agent.pid) / 1024


def run() -> tuple[list[Row], dict[str, Any]]:
    from bench.hostile_clients import GRACE, HTTP_CLIENTS, WS_CLIENTS, shutdown_under_clients

    raw: dict[str, Any] = {}
    ok, _ = webhook_peak("ok")
    huge, _ = webhook_peak("huge")
    bomb, wire = webhook_peak("bomb")
    raw.update(hostile_webhook_ok_rss_mib=ok, hostile_webhook_huge_rss_mib=huge, hostile_webhook_bomb_rss_mib=bomb)
    raw["hostile_webhook_bomb_wire_bytes"] = wire
    smart_ok, smart_ok_exit, _ = smart_run(False)
    smart_big, smart_big_exit, raw["hostile_smart_big_kills_logged"] = smart_run(True)
    if not raw["hostile_smart_big_kills_logged"]:
        raise BenchError("the hostile smartctl was never killed at the output limit: it did not run as --all")
    raw.update(hostile_smart_ok_rss_mib=smart_ok, hostile_smart_big_rss_mib=smart_big)
    raw.update(hostile_smart_ok_sigterm_s=smart_ok_exit, hostile_smart_big_sigterm_s=smart_big_exit)
    shutdown = shutdown_under_clients()
    if shutdown["rc"] != 0:
        raise BenchError(f"the agent under {HTTP_CLIENTS} + {WS_CLIENTS} clients exited {shutdown['rc']} on SIGTERM")
    raw.update({f"hostile_shutdown_{k}": v for k, v in shutdown.items()})
    clean, poisoned = tick_peak(False), tick_peak(True)
    raw.update(hostile_tick_clean_rss_mib=clean, hostile_tick_4mb_lines_rss_mib=poisoned)
    grace = Target("value", "<=", SMART_GRACE + 0.5, "shutdownGraceSeconds + 0.5 s")
    clients = f"{HTTP_CLIENTS} /metrics + {WS_CLIENTS} ws clients"
    rows = [
        Row(f"peak RSS, webhook answers 200 + 100 MB, {DELIVERIES} deliveries", huge, "MiB", ok, RSS_TARGET),
        Row(
            f"peak RSS, webhook answers a {BOMB_MIB} MiB gzip bomb, {DELIVERIES} deliveries",
            bomb,
            "MiB",
            ok,
            RSS_TARGET,
        ),
        Row("peak RSS, smartctl --all prints 200 MB, 4 disks", smart_big, "MiB", smart_ok, RSS_TARGET),
        Row("SIGTERM to exit, smartctl --all prints 200 MB", smart_big_exit, "s", smart_ok_exit, grace),
        Row(
            f"SIGTERM to exit, {clients}, grace {GRACE:g} s",
            shutdown["exit_s"],
            "s",
            target=Target("value", "<=", GRACE + 0.5, "shutdownGraceSeconds + 0.5 s"),
        ),
        Row(
            # Closed by the server before the process was gone (at the exit the kernel closes every socket anyway).
            f"/metrics clients not closed before the exit, {clients}",
            float(HTTP_CLIENTS - shutdown["http_closed_before_exit"]),
            target=Target("value", "<=", 0),
        ),
        Row(
            f"ws clients without a 1001 close, {clients}",
            float(shutdown["ws_no_1001"]),
            target=Target("value", "<=", 0),
        ),
        Row(f"peak RSS, {TICKS} core ticks + node_exporter, 4 MB lines in 5 files", poisoned, "MiB", clean, RSS_TARGET),
    ]
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
