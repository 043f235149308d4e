"""A migrating operator's scrape: Prometheus asks every ``/metrics`` for ``Accept-Encoding: gzip`` and node_exporter
answers gzipped; ``nvdaemon run`` on ``fixtures/hosts/gpunode`` (core tier, the node_exporter surface on) must too.

A real HTTP client sends the headers Prometheus sends and checks the answer (gzip, ``Vary``, the length on the
wire, the same page as identity, a valid exposition); then Debian's Prometheus scrapes the agent through a loopback
relay that keeps the bytes each way, so the test sees that Prometheus asked for gzip, got it, and stored the page
(``up == 1`` and the agent's series queryable).
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node_exporter.exposition import parse
from tests.node_exporter.oracle import textfile_dir
from tests.stack.prometheus import Prometheus, poll
from tests.test_e2e import ROOT, Agent, free_port, wait_for

HOST = ROOT / "fixtures" / "hosts" / "gpunode"
JOB = "nvdaemon"
# What Prometheus 2.x sends on a scrape (scrape/scrape.go), bar the timeout header.
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
    "User-Agent": "Prometheus/2.42.0",
}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    config = {
        "node": "gz-node",
        "tiers": ["core"],
        "stateDir": str(tmp_path / "state"),
        "shutdownGraceSeconds": 5,
        "sinks": {"metrics": {"listenAddr": f"127.0.0.1:{free_port()}"}},
        "nodeExporter": {"enabled": True, "textfileDirectory": str(textfile_dir(HOST))},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(config, indent=1))  # JSON is YAML; Agent reads the port
    a = Agent(tmp_path, HOST, tmp_path / "config.yaml")
    a.start()
    yield a
    a.kill()


def scrape(port: int, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics", headers=headers)
        resp = conn.getresponse()
        assert resp.status == 200
        return {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_a_prometheus_style_scrape_gets_gzip(agent: Agent) -> None:
    def settled() -> tuple[dict[str, str], bytes, bytes] | None:
        """A gzip answer between two identical identity answers (no tick in between), so the pages must match."""
        _, before = scrape(agent.port, {})
        headers, body = scrape(agent.port, PROMETHEUS_HEADERS)
        _, after = scrape(agent.port, {})
        return (headers, body, before) if before == after else None

    headers, body, plain = wait_for(settled, "three scrapes without a tick between them")
    assert headers.get("content-encoding") == "gzip", headers
    assert headers.get("vary") == "Accept-Encoding"
    assert headers.get("content-type") == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    assert gzip.decompress(body) == plain
    families = parse(plain.decode())  # a valid exposition: every line parses, no series twice
    assert "node_scrape_collector_success" in families and "nodevitals_hw_load1" in families
    # The point of it: the page with the node_* surface is a fraction of its size on the wire.
    assert len(body) * 4 < len(plain), (len(body), len(plain))
    # Without gzip in Accept-Encoding the answer stays identity (a curl, a kubelet, an old scraper).
    identity_headers, _ = scrape(agent.port, {"Accept-Encoding": "identity"})
    assert "content-encoding" not in identity_headers and identity_headers["vary"] == "Accept-Encoding"


class Relay:
    """A TCP relay on 127.0.0.1 to ``target_port`` that keeps every byte sent each way (requests, responses)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.requests = bytearray()
        self.responses = bytearray()
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []

    def __enter__(self) -> Relay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:  # closed by __exit__
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, self.requests), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.responses), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, seen: bytearray) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self.lock:
                    seen += data
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)

    def seen(self) -> tuple[bytes, bytes]:
        with self.lock:
            return bytes(self.requests).lower(), bytes(self.responses).lower()


def test_prometheus_scrapes_the_gzip_answer(agent: Agent, tmp_path: Path) -> None:
    with Relay(agent.port) as relay:
        scrape_config = {"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{relay.port}"]}]}
        with Prometheus(tmp_path / "prometheus", [scrape_config], []) as prom:
            poll(lambda: prom.value(f'up{{job="{JOB}"}}') == 1.0, "up == 1")
            poll(lambda: prom.query(f'nodevitals_hw_load1{{job="{JOB}",node="gz-node"}}'), "the agent's load1 stored")
            poll(lambda: prom.query(f'node_load1{{job="{JOB}"}}'), "the node_* surface stored")
            requests, responses = relay.seen()
    assert b"\r\naccept-encoding: gzip\r\n" in requests
    assert b"\r\ncontent-encoding: gzip\r\n" in responses
    assert b"\r\nvary: accept-encoding\r\n" in responses
