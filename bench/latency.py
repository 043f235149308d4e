"""Event latency: a fixture file crosses a rule's threshold -> the ENTER at a webhook receiver, a ``/v1/events``
websocket client and the NVSentinel platform-connector, measured from the start of the tick that saw the change.

The agent runs on a copy of ``fixtures/hosts/faulty`` (tick every 0.25 s) with one rule, ``cpu_package_hot``
(coretemp "Package id 0" >= 95 C, critical, so a fatal HealthEvent too), and three sinks: the loopback receiver of
``tests/sinks/receiver.py`` (signature and CloudEvent checked), one websocket client, and the test connector of
``tests/nvsentinel/connector.py`` on a Unix socket. CHANGES times: the sensor file is replaced (atomically) with
99 C; once the ENTER has reached all three, 60 C, and the EXIT is awaited likewise. The tick's start is the event's
own ``started_at`` (the snapshot time the engine evaluated it at, taken at the start of the tick); the latency is
the wall-clock arrival at each consumer minus that. For the connector, whose HealthEvent does not carry the id, the
arrival of the first unhealthy ``NvdaemonCpuPackageHot`` after the change was written is matched with that
change's ENTER.

``python -m bench.latency`` runs it alone.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2

from bench.common import SECRET, AgentProcess, BenchError, EventClient, copy_host, percentile
from bench.table import Row, Target
from nvdaemon.proto import health_event_pb2 as pb
from tests.nvsentinel.connector import FakeConnector
from tests.sinks.receiver import Received, Receiver

CHANGES = 30
INTERVAL = 0.25
HOT, COOL = "99000\n", "60000\n"
CONDITION = "cpu_package_hot"
CHECK = "NvdaemonCpuPackageHot"
TARGET = Target("value", "<=", 50.0)


class TimedReceiver(Receiver):
    """The test receiver, with each request's arrival as wall-clock time (it keeps monotonic time)."""

    def _record(self, headers: dict[str, str], body: bytes, port: int) -> Received:
        at = time.time()
        rec = super()._record(headers, body, port)
        rec.at = at
        return rec

    def events(self) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return [(r.at, r.data) for r in self.received if isinstance(r.data, dict)]


class TimedConnector(FakeConnector):
    """The test platform-connector, noting the wall-clock arrival of every HealthEvent."""

    def __init__(self, socket_path: Path, node: str, token_file: Path | None) -> None:
        super().__init__(socket_path, node, token_file)
        self.arrivals: list[tuple[float, pb.HealthEvent]] = []

    def handle(self, request: pb.HealthEvents, context: grpc.ServicerContext) -> empty_pb2.Empty:
        at = time.time()
        with self.lock:
            self.arrivals += [(at, ev) for ev in request.events]
        return super().handle(request, context)

    def faults_after(self, t: float) -> list[float]:
        with self.lock:
            return [at for at, ev in self.arrivals if at >= t and ev.checkName == CHECK and not ev.isHealthy]

    def clears_after(self, t: float) -> list[float]:
        with self.lock:
            return [at for at, ev in self.arrivals if at >= t and ev.checkName == CHECK and ev.isHealthy]


def sensor(root: Path) -> Path:
    for chip in sorted((root / "sys" / "class" / "hwmon").iterdir()):
        if (chip / "name").read_text().strip() == "coretemp":
            return chip / "temp1_input"
    raise BenchError("fixture host has no coretemp chip")


def write(path: Path, text: str) -> float:
    """Replace the file's content atomically (a reader never sees it half written); the wall time it happened."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    at = time.time()
    os.replace(tmp, path.resolve())
    return at


Arrivals = list[tuple[float, dict[str, Any]]]


def phase_after(
    events: Callable[[Any], Arrivals], source: Any, phase: str, t: float
) -> tuple[float, dict[str, Any]] | None:
    """The first ENTER or EXIT of the condition that ``events(source)`` shows arriving at or after ``t``."""
    for at, data in events(source):
        if at >= t and data.get("condition") == CONDITION and data.get("phase") == phase:
            return at, data
    return None


def stream_events(client: EventClient) -> list[tuple[float, dict[str, Any]]]:
    return [(at, doc["data"]) for at, doc in client.events() if isinstance(doc.get("data"), dict)]


def wait(what: str, predicate: Callable[..., Any], *args: Any, timeout: float = 10.0) -> Any:
    """Poll ``predicate(*args)`` until it is true; its result."""
    deadline = time.monotonic() + timeout
    while not (result := predicate(*args)):
        if time.monotonic() > deadline:
            raise BenchError(f"event latency: no {what} within {timeout:g}s")
        time.sleep(0.002)
    return result


def run() -> tuple[list[Row], dict[str, Any]]:
    lat: dict[str, list[float]] = {"webhook": [], "stream": [], "nvsentinel": []}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nvdaemon-latency-")))
        root = copy_host("faulty", tmp)  # with a boot id: the NVSentinel sink reads it
        temp = sensor(root)
        write(temp, COOL)
        token = tmp / "token"
        token.write_text("bench-token")
        receiver = TimedReceiver(SECRET)
        stack.enter_context(receiver)
        connector = TimedConnector(tmp / "pc.sock", "bench-node", token)
        connector.start()
        stack.callback(connector.stop)
        config = {
            "node": "bench-node",
            "tiers": ["core"],
            "intervalSeconds": INTERVAL,
            "sinks": {
                "webhook": [{"url": receiver.url, "secret": SECRET}],
                "nvsentinel": {"enabled": True, "socketPath": str(tmp / "pc.sock"), "tokenPath": str(token)},
                "stream": {"enabled": True},
            },
            "rules": [
                {
                    "metric": "temp_celsius",
                    "device": "hwmon*/coretemp/temp1",
                    "condition": CONDITION,
                    "severity": "critical",
                    "threshold": 95,
                    "op": ">=",
                }
            ],
        }
        agent = stack.enter_context(AgentProcess(config, root))
        client = EventClient(agent.port).start()
        stack.callback(client.stop)
        time.sleep(1.0)  # the NVSentinel healthy baseline and the first ticks are out of the way
        for _ in range(CHANGES):
            t = write(temp, HOT)
            at, data = wait("ENTER on the websocket", phase_after, stream_events, client, "ENTER", t)
            tick = dt.datetime.fromisoformat(data["started_at"]).timestamp()  # RFC 3339, UTC
            lat["stream"].append(at - tick)
            at, _ = wait("ENTER at the webhook", phase_after, TimedReceiver.events, receiver, "ENTER", t)
            lat["webhook"].append(at - tick)
            lat["nvsentinel"].append(wait("fault at the connector", connector.faults_after, t)[0] - tick)
            t = write(temp, COOL)
            wait("EXIT on the websocket", phase_after, stream_events, client, "EXIT", t)
            wait("EXIT at the webhook", phase_after, TimedReceiver.events, receiver, "EXIT", t)
            wait("clear at the connector", connector.clears_after, t)
    raw: dict[str, Any] = {"latency_changes": CHANGES, "latency_interval_s": INTERVAL}
    rows = []
    for sink, values in lat.items():
        p50, p99 = percentile(values, 50) * 1000, percentile(values, 99) * 1000
        raw[f"latency_{sink}_p50_ms"], raw[f"latency_{sink}_p99_ms"] = p50, p99
        raw[f"latency_{sink}_max_ms"] = max(values) * 1000
        rows.append(Row(f"event latency tick->{sink} p50", p50, "ms"))
        rows.append(Row(f"event latency tick->{sink} p99", p99, "ms", target=TARGET))
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
