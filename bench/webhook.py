"""Webhook delivery figures for ``make bench``:

- events per second delivered, signed, to a loopback receiver (2,000 events published at once; the real spool),
  and the agent's CPU per delivered event. The receiver (``python -m bench.webhook receive``: Python's
  ``http.server``, keep-alive) runs in its own process, as a real receiver does: in a thread of this process it
  would take the agent's GIL for every request it parses;
- p50/p99 latency from emission (``bus.publish``) to receipt by the receiver, one event at a time (no backlog);
- the agent's RSS (a ``nvdaemon run`` subprocess) with 100,000 events in its spool and its receiver down.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

import msgspec
import trio

from bench.common import SECRET, AgentProcess, free_port, get, rss_kib
from nvdaemon.bus import EventBus
from nvdaemon.config import SpoolConfig, WebhookSink
from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.spool import FILE, SpoolDB

THROUGHPUT_EVENTS = 2000
LATENCY_EVENTS = 300
SPOOLED = 100_000


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # the sender cut its keep-alive connection at the end
            super().handle_error(request, client_address)


def receive() -> None:
    """The receiver process: prints its URL, then ``<webhook-id> <perf_counter>`` for each POST as it arrives
    (perf_counter is CLOCK_MONOTONIC, the same clock in every process)."""
    out = sys.stdout

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            out.write(f"{self.headers['webhook-id']} {time.perf_counter()}\n")
            out.flush()
            self.send_response(204)
            self.send_header("content-length", "0")
            self.end_headers()

    server = _Server(("127.0.0.1", 0), Handler)
    out.write(f"http://127.0.0.1:{server.server_address[1]}/hook\n")
    out.flush()
    server.serve_forever()


class Sink:
    """A keep-alive loopback receiver in its own process; ``arrived`` maps each webhook-id to when it arrived."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.webhook", "receive"], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, lines: IO[str]) -> None:
        for line in lines:
            event_id, _, at = line.partition(" ")
            self.arrived[event_id] = float(at)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def event(i: int) -> Event:
    now = time.time()
    return Event(
        id=new_event_id(now),
        node="bench-node",
        tier="core",
        device=f"nvme{i % 8}n1",
        condition="smart_pending_sectors",
        phase=Phase.ENTER,
        severity=("info", "warning", "critical")[i % 3],
        seq=i,
        started_at=now,
        detail={"value": float(i), "threshold": 0.0, "metric": "smart_pending_sectors", "labels": {}},
    )


def delivery() -> dict[str, float]:
    rx = Sink()
    hook = msgspec.convert({"url": rx.url, "secret": SECRET}, WebhookSink)

    async def main(state: Path) -> dict[str, float]:
        bus = EventBus()
        sink = WebhookEndpoint("webhook:bench", hook, SpoolConfig(), state)
        sink.attach(bus)
        async with trio.open_nursery() as nursery:
            await nursery.start(sink.serve)
            # Throughput: everything published at once, delivered one ordered request at a time.
            events = [event(i) for i in range(THROUGHPUT_EVENTS)]
            t0, cpu0 = time.perf_counter(), time.process_time()
            for ev in events:
                bus.publish(ev)
            while sink.attempts.get("success", 0) < THROUGHPUT_EVENTS:  # noqa: ASYNC110 (a poll, on purpose)
                await trio.sleep(0.005)
            rate = THROUGHPUT_EVENTS / (time.perf_counter() - t0)
            cpu = (time.process_time() - cpu0) / THROUGHPUT_EVENTS
            with trio.move_on_after(5):  # the receiver's lines reach this process a moment after its answers
                while any(ev.id not in rx.arrived for ev in events):  # noqa: ASYNC110 (the reader thread's dict)
                    await trio.sleep(0.01)
            missing = [ev.id for ev in events if ev.id not in rx.arrived]
            order = sorted(events, key=lambda ev: rx.arrived.get(ev.id, float("inf")))
            # Latency with no backlog: one event at a time, emission to receipt.
            lat = []
            for i in range(LATENCY_EVENTS):
                ev = event(i)
                sent = time.perf_counter()
                bus.publish(ev)
                while ev.id not in rx.arrived:  # noqa: ASYNC110 (set by the receiver's thread)
                    await trio.sleep(0.0005)
                lat.append(rx.arrived[ev.id] - sent)
            nursery.cancel_scope.cancel()
        lat.sort()
        return {
            "webhook_events_per_s": rate,
            "webhook_agent_cpu_us_per_event": cpu * 1e6,
            "webhook_missing_at_receiver": len(missing),
            "webhook_out_of_order": sum(1 for a, b in zip(order, events, strict=True) if a is not b),
            "webhook_latency_p50_ms": statistics.median(lat) * 1000,
            "webhook_latency_p99_ms": lat[int(len(lat) * 0.99) - 1] * 1000,
        }

    try:
        with tempfile.TemporaryDirectory() as tmp:
            return trio.run(main, Path(tmp))
    finally:
        rx.close()


def fill_spool(state: Path, url: str) -> dict[str, float]:
    """Spool SPOOLED events in ``state`` for the webhook endpoint at ``url`` (a loopback host:port); the spool's size.
    bench/rss.py's spooled shape uses it too."""
    db = SpoolDB(state / FILE)
    name = f"webhook:{urlsplit(url).netloc}"
    for start in range(0, SPOOLED, 10_000):
        items = [
            (ev.id, i % 3, msgspec.json.encode(ev)) for i, ev in ((i, event(i)) for i in range(start, start + 10_000))
        ]
        db.add(name, items, SPOOLED, 1 << 40)
    db.close()
    return {"spooled_events": SPOOLED, "spool_file_mib": (state / FILE).stat().st_size / 2**20}


def spooled_rss() -> dict[str, float]:
    """RSS of a running agent whose spool holds SPOOLED events for an endpoint that is down."""
    down = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        name = f"webhook:127.0.0.1:{down}"
        spool_mib = fill_spool(state, f"http://127.0.0.1:{down}/hook")["spool_file_mib"]
        config = {
            "stateDir": str(state),
            "sinks": {"webhook": [{"url": f"http://127.0.0.1:{down}/hook", "secret": SECRET}]},
        }
        with AgentProcess(config) as agent:
            time.sleep(3)  # a few failed attempts against the backlog
            backlog = msgspec.json.decode(get(agent.url + "/v1/status")[1])["sinks"][name]["backlog"]
            rss = rss_kib(agent.pid)
    return {
        "webhook_spooled_events": backlog,
        "webhook_spool_file_mib": spool_mib,
        "webhook_rss_spooled_mib": rss / 1024,
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["receive"]:
        receive()
    else:
        print(delivery())
