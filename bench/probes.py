"""``/healthz`` and ``/readyz`` while ``CLIENTS`` keep-alive clients hammer ``/metrics`` (issue 15: up to 4.4 s seen,
against the chart's 5 s probe timeout; target: every probe within 1 s).

The agent: ``nvdaemon run`` with the core tier and the node_exporter surface on ``fixtures/hosts/gpunode``, default
server settings (maxConnections 1024: every client is served). The load: a separate process (so it does not share
our GIL) with ``CLIENTS`` trio connections, each sending ``GET /metrics`` again as soon as the previous answer is
read, reconnecting when closed. The probes: from this process, a new connection per probe as the kubelet makes
one, ``/healthz`` and ``/readyz`` alternately every ``PROBE_EVERY`` seconds for ``SECONDS``. Figures: probe p50
and max (ms), probes that failed, the /metrics answers per second the load got, and the agent's peak RSS.

``python -m bench.probes`` runs it alone.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from typing import Any

import trio

from bench.common import FIXTURES, ROOT, AgentProcess, BenchError, peak_rss_kib, percentile, stop_process
from bench.table import Row, Target

CLIENTS = 500
SECONDS = 20.0
PROBE_EVERY = 0.25
TARGET = Target("value", "<=", 1000.0, "issue 15")


class _Closed(Exception):
    """The agent closed a load connection (it reconnects)."""


async def _read_response(stream: trio.SocketStream, buf: bytes) -> tuple[bytes, bytes]:
    """One response (head, the bytes after it) from ``buf`` and the stream; _Closed when the agent closed."""
    while b"\r\n\r\n" not in buf:
        buf += await _receive(stream)
    head, _, buf = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buf) < length:
        buf += await _receive(stream)
    return head, buf[length:]


async def _receive(stream: trio.SocketStream) -> bytes:
    chunk = await stream.receive_some(65536)
    if not chunk:
        raise _Closed
    return chunk


async def _load(port: int, clients: int, seconds: float) -> int:
    """Hammer /metrics from ``clients`` keep-alive connections for ``seconds``; the answers counted."""
    answered = 0
    request = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n"

    async def client() -> None:
        nonlocal answered
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.05)
                continue
            buf = b""
            try:
                while True:
                    await stream.send_all(request)
                    head, buf = await _read_response(stream, buf)
                    answered += 1
                    if b"connection: close" in head.lower():
                        break
            except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                await stream.aclose()

    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)
    return answered


def _probe(port: int, path: str) -> float | None:
    """Seconds to a complete answer on a new connection, or None when it failed or took over 5 s (the chart's
    probe timeout)."""
    began = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        json.loads(resp.read())
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    return time.perf_counter() - began


def run() -> tuple[list[Row], dict[str, Any]]:
    config: dict[str, Any] = {"node": "bench-node", "tiers": ["core"], "nodeExporter": {"enabled": True}}
    with AgentProcess(config, FIXTURES / "hosts" / "gpunode") as agent:
        load = subprocess.Popen(
            [sys.executable, "-m", "bench.probes", "--load", str(agent.port), str(CLIENTS), str(SECONDS)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        try:
            time.sleep(2.0)  # every client connected and hammering
            times: list[float] = []
            failed = 0
            end = time.monotonic() + SECONDS - 4.0
            paths = ("/healthz", "/readyz")
            while time.monotonic() < end:
                took = _probe(agent.port, paths[len(times) % 2])
                if took is None:
                    failed += 1
                else:
                    times.append(took)
                time.sleep(PROBE_EVERY)
            out, _ = load.communicate(timeout=SECONDS + 30)
            peak_mib = peak_rss_kib(agent.pid) / 1024
        finally:
            stop_process(load, 5)
    if load.returncode != 0:
        raise BenchError(f"the load generator exited with {load.returncode}")
    answered = int(out.decode().split()[-1])
    ms = [t * 1000 for t in times]
    p50, worst, per_s = percentile(ms, 50), max(ms, default=float("nan")), answered / SECONDS
    raw: dict[str, Any] = {
        "probe_p50_ms": p50,
        "probe_p99_ms": percentile(ms, 99),
        "probe_max_ms": worst,
        "probe_failed": failed,
        "probes": len(ms) + failed,
        "probe_ms": [round(t) for t in ms],
        "metrics_answers_per_s": per_s,
        "agent_peak_rss_mib": peak_mib,
    }
    rows = [
        Row(f"/healthz,/readyz under {CLIENTS} /metrics clients p50", p50, "ms"),
        Row(f"/healthz,/readyz under {CLIENTS} /metrics clients max", worst, "ms", target=TARGET),
        Row(f"/healthz,/readyz under {CLIENTS} /metrics clients failed", float(failed)),
        Row(f"/metrics answers/s to {CLIENTS} keep-alive clients", per_s, "/s"),
        Row(f"agent peak RSS with {CLIENTS} keep-alive clients", peak_mib, "MiB"),
    ]
    return rows, raw


def main(argv: list[str]) -> int:
    if argv[:1] == ["--load"]:
        port, clients, seconds = int(argv[1]), int(argv[2]), float(argv[3])
        print(trio.run(_load, port, clients, seconds))
        return 0
    rows, raw = run()
    for row in rows:
        print(" | ".join(row.cells()))
    print(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
