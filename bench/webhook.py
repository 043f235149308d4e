"""Webhook delivery figures for ``make bench``:

- events per second delivered, signed, to a loopback receiver (2,000 events published at once; the real spool);
- p50/p99 latency from emission (``bus.publish``) to receipt by the receiver, one event at a time (no backlog);
- the agent's RSS (a ``nvdaemon run`` subprocess) with 100,000 events in its spool and its receiver down.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
import trio

from bench.common import SECRET, AgentProcess, free_port, get, rss_kib
from nvdaemon.bus import EventBus
from nvdaemon.config import SpoolConfig, WebhookSink
from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.sinks.spool import FILE, SpoolDB
from nvdaemon.sinks.webhook import WebhookEndpoint

THROUGHPUT_EVENTS = 2000
LATENCY_EVENTS = 300
SPOOLED = 100_000


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # the sender cut its keep-alive connection at the end
            super().handle_error(request, client_address)


class Sink:
    """A keep-alive loopback receiver that notes when each webhook-id arrived (perf_counter)."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                with sink.cond:
                    sink.arrived[self.headers["webhook-id"]] = time.perf_counter()
                    sink.cond.notify_all()
                self.send_response(204)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
            t0 = time.perf_counter()
            for ev in events:
                bus.publish(ev)
            while sink.attempts.get("success", 0) < THROUGHPUT_EVENTS:  # noqa: ASYNC110 (a poll, on purpose)
                await trio.sleep(0.005)
            rate = THROUGHPUT_EVENTS / (time.perf_counter() - t0)
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
