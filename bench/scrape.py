"""``/metrics`` against node_exporter on the same host root: latency p50/p99 and CPU per scrape, interleaved, over a
kept-alive connection and over a new connection per scrape, on ``fixtures/hosts/gpunode`` and on this machine's own
``/proc`` and ``/sys`` (host root ``/``).

Ours: ``nvdaemon run`` with the core tier and the node_exporter surface (``nodeExporter.enabled`` with the host's
textfile directory, every collector of ``options.DEFAULTS``), default interval (15 s): a scrape is served from the
cached exposition, and the first scrape after a tick renders the parts that tick changed (so any tick that falls
inside a loop is paid by a measured scrape). Theirs: Debian's node_exporter with the flags of
``tests/node_exporter/oracle.py`` (same host root, same filters, the same collectors), which collects on every
scrape. For each host and each connection mode, SCRAPES scrapes of each, alternately (ours, then theirs), each
asking ``Accept-Encoding: gzip`` as Prometheus does (both answer gzip; an answer that is not gzip fails the
benchmark): "keep-alive" reuses one connection per side as Prometheus does; "new connection" connects, scrapes and
closes each time (what a scraper that does not keep connections costs). Latency is the client's wall time for the
whole exchange up to the last byte of the compressed body (connect included in the second mode; decompressing, done
after the clock stops, is not). CPU per scrape: the delta of each process's CPU-time clock
(``bench.common.cpu_seconds``) over the loop, divided by the scrapes; ours therefore includes any tick inside the
loop, and the one compression of each changed page. Bytes per scrape: the body on the wire (gzip; the response head
not counted), per host, from the keep-alive loop (the page is the same in both modes); ``exposition_bytes`` in the
raw figures is the page after decompression. Every answer is decompressed; the warm-up answers are also parsed as
an exposition.

``BENCH_NODE_EXPORTER_COLLECTORS=loadavg,cpu`` restricts both sides to those collectors (while developing);
``BENCH_SCRAPES`` changes SCRAPES. ``python -m bench.scrape`` runs it alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.client
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from bench.common import FIXTURES, AgentProcess, BenchError, cpu_seconds, free_port, percentile, stop_process
from bench.table import Row, Target
from nvdaemon.compat.node_exporter.options import DEFAULTS
from tests.node_exporter.exposition import parse
from tests.node_exporter.oracle import binary, flags_for, options_for, textfile_dir

SCRAPES = int(os.environ.get("BENCH_SCRAPES", "500"))
WARMUP = 5
HOST = FIXTURES / "hosts" / "gpunode"
HOSTS = (("gpunode", HOST), ("this host", Path("/")))  # (figure label, host root)
MODES = ("keep-alive", "new connection")
TARGET = Target("ratio", "<=", 0.25)
# What Prometheus 2.x sends with every scrape (scrape/scrape.go), bar its timeout header.
HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


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
        self.log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> NodeExporter:
        # Its log goes to a file, not a pipe nobody reads: on a host without the textfile directory (this machine's
        # own root) it logs an error on every scrape, and a full pipe would stall it after a few hundred.
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace")
                raise BenchError(f"node_exporter exited with {self.proc.returncode}: {err[-2000:]}")
            with contextlib.suppress(OSError):
                if scrape(http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)).status == 200:
                    return self
            if time.monotonic() > deadline:
                raise BenchError("node_exporter did not answer within 20 s")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_process(self.proc, 10)
        if self.log is not None:
            self.log.close()


@dataclasses.dataclass(frozen=True)
class Answer:
    status: int
    encoding: str  # Content-Encoding ("" for identity)
    body: bytes  # as it came over the wire

    def page(self, who: str) -> bytes:
        """The exposition, decompressed; BenchError unless the answer was gzip (both sides answer gzip when asked)."""
        if self.status != 200:
            raise BenchError(f"{who}: /metrics answered {self.status}")
        if self.encoding != "gzip":
            raise BenchError(f"{who}: /metrics answered {self.encoding or 'identity'} to Accept-Encoding: gzip")
        try:
            return gzip.decompress(self.body)
        except (OSError, EOFError) as exc:
            raise BenchError(f"{who}: /metrics sent a broken gzip body: {exc}") from exc


def scrape(conn: http.client.HTTPConnection) -> Answer:
    """One GET /metrics over ``conn`` (kept alive, or connected by this request) with Prometheus's headers."""
    conn.request("GET", "/metrics", headers=HEADERS)
    resp = conn.getresponse()
    body = resp.read()
    return Answer(resp.status, resp.getheader("Content-Encoding", ""), body)


class KeptConnection:
    """One target's connection, kept from scrape to scrape as Prometheus keeps it; opened again, and counted in
    ``opened``, when there is none yet or the server has closed it."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self.opened = 0

    def scrape(self) -> Answer:
        """``scrape`` over the kept connection. A request the server answered by closing the connection it had kept
        idle is sent once more, on a new one, as Go's HTTP client retries it."""
        try:
            return self._scrape()
        except ConnectionError:  # RemoteDisconnected included: closed while idle
            self.conn.close()
            return self._scrape()

    def _scrape(self) -> Answer:
        if self.conn.sock is None:  # connected by this request (http.client also drops a connection once closed)
            self.opened += 1
        return scrape(self.conn)

    def close(self) -> None:
        self.conn.close()


def scraper(port: int, mode: str) -> tuple[Callable[[], Answer], Callable[[], None]]:
    """(one scrape, close) for ``mode``: one kept-alive connection, or a new one per scrape, closed after it."""
    if mode == "keep-alive":
        kept = KeptConnection(port)
        return kept.scrape, kept.close

    def fresh() -> Answer:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            return scrape(conn)
        finally:
            conn.close()

    return fresh, lambda: None


def surface(port: int, names: list[str]) -> None:
    """Fail unless our exposition reports every asked-for node_exporter collector (else the figures mean little)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
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


def interleaved(targets: list[tuple[str, int, int]], mode: str) -> dict[str, Any]:
    """SCRAPES scrapes of each target (who, pid, port) in ``mode``, alternately: raw figures keyed by ``who``."""
    scrapers = {who: scraper(port, mode) for who, _, port in targets}
    for who, (do, _) in scrapers.items():
        for _ in range(WARMUP):
            try:
                parse(do().page(who).decode())
            except ValueError as exc:  # UnicodeDecodeError included
                raise BenchError(f"{who}: /metrics is not a valid exposition: {exc}") from exc
    times: dict[str, list[float]] = {who: [] for who, _, _ in targets}
    sizes: dict[str, int] = {}
    wire: dict[str, int] = {}
    cpu0 = {who: cpu_seconds(pid) for who, pid, _ in targets}
    for _ in range(SCRAPES):
        for who, _, _ in targets:  # interleaved: ours, then theirs
            do = scrapers[who][0]
            t0 = time.perf_counter()
            try:
                answer = do()
            except OSError as exc:
                raise BenchError(f"{who}: /metrics scrape {len(times[who]) + 1} ({mode}) failed: {exc!r}") from exc
            times[who].append(time.perf_counter() - t0)
            sizes[who], wire[who] = len(answer.page(who)), len(answer.body)
    cpu = {who: (cpu_seconds(pid) - cpu0[who]) / SCRAPES for who, pid, _ in targets}
    for _, close in scrapers.values():
        close()
    out: dict[str, Any] = {}
    for who, took in times.items():
        out[f"{who}_p50_ms"] = percentile(took, 50) * 1000
        out[f"{who}_p99_ms"] = percentile(took, 99) * 1000
        out[f"{who}_cpu_ms_per_scrape"] = cpu[who] * 1000
        out[f"{who}_exposition_bytes"] = sizes[who]
        out[f"{who}_wire_bytes"] = wire[who]
    return out


def key(host: str, mode: str) -> str:
    """The raw figures' prefix for a host and a mode, e.g. ``scrape_gpunode_keepalive_``."""
    return f"scrape_{host.replace(' ', '_')}_{mode.replace('-', '').replace(' ', '_')}_"


def measure(host: str, root: Path, names: list[str]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    with AgentProcess(agent_config(root, names), root) as agent, reference(root, names) as ne:
        targets = [("ours", agent.pid, agent.port)]
        if ne is not None:
            targets.append(("theirs", ne.pid, ne.port))
        surface(agent.port, names)
        for mode in MODES:
            raw.update({key(host, mode) + k: v for k, v in interleaved(targets, mode).items()})
    return raw


def run() -> tuple[list[Row], dict[str, Any]]:
    names = collectors()
    raw: dict[str, Any] = {"scrape_collectors": len(names), "scrapes": SCRAPES}
    rows: list[Row] = []
    for host, root in HOSTS:
        raw.update(measure(host, root, names))
        for mode in MODES:
            k = key(host, mode)

            def ref(figure: str, k: str = k) -> float | str:
                value: float | str = raw.get(f"{k}theirs_{figure}", "not installed")
                return value

            label = f"/metrics {host}, {mode} ({len(names)} coll.)"
            rows.append(Row(f"{label} p99", raw[k + "ours_p99_ms"], "ms", ref("p99_ms"), TARGET))
            if mode == "keep-alive":
                rows.append(
                    Row(f"{label} CPU/scrape", raw[k + "ours_cpu_ms_per_scrape"], "ms", ref("cpu_ms_per_scrape"))
                )
                rows.append(Row(f"{label} gzip bytes/scrape", raw[k + "ours_wire_bytes"], "B", ref("wire_bytes")))
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
