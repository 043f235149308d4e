"""``/metrics`` against node_exporter on the same host root: latency p50/p99 and CPU per scrape, interleaved.

Ours: ``nvdaemon run`` with the core tier and the node_exporter surface (``nodeExporter.enabled`` with the host's
textfile directory, every collector of ``options.DEFAULTS``) on ``fixtures/hosts/gpunode``, default interval (15 s):
a scrape is served from the exposition rendered once per tick. Theirs: Debian's node_exporter with the flags of
``tests/node_exporter/oracle.py`` (same host root, same filters, the same collectors), which collects on every
scrape. SCRAPES scrapes of each, alternately (ours, then theirs), each over its own keep-alive connection as
Prometheus keeps one, without gzip. CPU per scrape: the utime+stime delta of each process (/proc/<pid>/stat) over
the loop, divided by the scrapes; ours therefore includes any tick that fell inside the loop.

``BENCH_NODE_EXPORTER_COLLECTORS=loadavg,cpu`` restricts both sides to those collectors (while developing).
``python -m bench.scrape`` runs it alone.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import FIXTURES, AgentProcess, BenchError, cpu_seconds, free_port, percentile, stop_process
from bench.table import Row, Target
from nvdaemon.compat.node_exporter.options import DEFAULTS
from tests.node_exporter.oracle import binary, flags_for, options_for, textfile_dir

SCRAPES = 500
WARMUP = 5
HOST = FIXTURES / "hosts" / "gpunode"
TARGET = Target("ratio", "<=", 0.25)


def collectors() -> list[str]:
    """Every node_exporter collector we implement, or those named in BENCH_NODE_EXPORTER_COLLECTORS."""
    only = [c for c in os.environ.get("BENCH_NODE_EXPORTER_COLLECTORS", "").split(",") if c]
    unknown = set(only) - set(DEFAULTS)
    if unknown:
        raise BenchError(f"BENCH_NODE_EXPORTER_COLLECTORS: unknown collector(s) {', '.join(sorted(unknown))}")
    return sorted(only or DEFAULTS)


def agent_config(root: Path, names: list[str]) -> dict[str, Any]:
    return {
        "node": "bench-node",
        "tiers": ["core"],
        "nodeExporter": {
            "enabled": True,
            "textfileDirectory": str(textfile_dir(root)),
            "collectors": {name: name in names for name in DEFAULTS},
        },
    }


class NodeExporter:
    """Debian's node_exporter on a loopback port with the oracle's flags; its pid for CPU and RSS."""

    def __init__(self, root: Path, names: list[str]) -> None:
        exe = binary()
        if exe is None:
            raise BenchError("prometheus-node-exporter is not installed")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        flags = flags_for(root, options_for(root), names)
        self.cmd = [exe, f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=error", *flags]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> NodeExporter:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise BenchError(f"node_exporter exited with {self.proc.returncode}: {err[-2000:]}")
            with contextlib.suppress(OSError):
                if scrape(http.client.HTTPConnection("127.0.0.1", self.port, timeout=5))[1] == 200:
                    return self
            if time.monotonic() > deadline:
                raise BenchError("node_exporter did not answer within 20 s")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)


def scrape(conn: http.client.HTTPConnection) -> tuple[int, int]:
    """One GET /metrics over a kept-alive connection: (bytes, status)."""
    conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
    resp = conn.getresponse()
    body = resp.read()
    return len(body), resp.status


def surface(conn: http.client.HTTPConnection, names: list[str]) -> None:
    """Fail unless our exposition reports every asked-for node_exporter collector (else the figures mean little)."""
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    seen = set(re.findall(r'^node_scrape_collector_success\{collector="([^"]+)"\}', text, re.MULTILINE))
    if missing := sorted(set(names) - seen):
        raise BenchError(f"the agent's node_exporter surface lacks collector(s): {', '.join(missing)}")


@contextlib.contextmanager
def reference(root: Path, names: list[str]) -> Iterator[NodeExporter | None]:
    """node_exporter when installed, else None (the table then says "not installed")."""
    if binary() is None:
        yield None
        return
    with NodeExporter(root, names) as ne:
        yield ne


def run(root: Path = HOST) -> tuple[list[Row], dict[str, Any]]:
    names = collectors()
    raw: dict[str, Any] = {"scrape_host": root.name, "scrape_collectors": len(names), "scrapes": SCRAPES}
    with AgentProcess(agent_config(root, names), root) as agent, reference(root, names) as ne:
        targets: list[tuple[str, int, http.client.HTTPConnection]] = [
            ("ours", agent.pid, http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10))
        ]
        if ne is not None:
            targets.append(("theirs", ne.pid, http.client.HTTPConnection("127.0.0.1", ne.port, timeout=10)))
        for _, _, conn in targets:
            for _ in range(WARMUP):
                _, status = scrape(conn)
                if status != 200:
                    raise BenchError(f"/metrics answered {status}")
        surface(targets[0][2], names)
        times: dict[str, list[float]] = {who: [] for who, _, _ in targets}
        sizes: dict[str, int] = {}
        cpu0 = {who: cpu_seconds(pid) for who, pid, _ in targets}
        for _ in range(SCRAPES):
            for who, _, conn in targets:  # interleaved: ours, then theirs
                t0 = time.perf_counter()
                sizes[who], _ = scrape(conn)
                times[who].append(time.perf_counter() - t0)
        cpu = {who: (cpu_seconds(pid) - cpu0[who]) / SCRAPES for who, pid, _ in targets}
        for _, _, conn in targets:
            conn.close()
    for who, took in times.items():
        raw[f"scrape_{who}_p50_ms"] = percentile(took, 50) * 1000
        raw[f"scrape_{who}_p99_ms"] = percentile(took, 99) * 1000
        raw[f"scrape_{who}_cpu_ms_per_scrape"] = cpu[who] * 1000
        raw[f"scrape_{who}_exposition_bytes"] = sizes[who]

    def ref(key: str) -> float | str:
        value: float | str = raw.get(f"scrape_theirs_{key}", "not installed")
        return value

    label = f"/metrics core+node_exporter ({len(names)} coll.)"
    rows = [
        Row(f"{label} p50", raw["scrape_ours_p50_ms"], "ms", ref("p50_ms"), TARGET),
        Row(f"{label} p99", raw["scrape_ours_p99_ms"], "ms", ref("p99_ms"), TARGET),
        Row(f"{label} CPU/scrape", raw["scrape_ours_cpu_ms_per_scrape"], "ms", ref("cpu_ms_per_scrape"), TARGET),
    ]
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
