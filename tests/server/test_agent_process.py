"""The server limits on ``nvdaemon run`` as a real subprocess: held connections under a low RLIMIT_NOFILE, and a
reload to a listenAddr that cannot be had (the running server stays) or can (bound before the old one closes)."""

from __future__ import annotations

import resource
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdaemon.promtext import parse_text
from tests.test_e2e import ROOT, Agent, free_port, wait_for

CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.5
stateDir: {state}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
"""
NOFILE = 128


class LimitedAgent(Agent):
    def start(self, nofile: int | None = None, soft: int | None = None) -> None:
        """``nvdaemon run``, with RLIMIT_NOFILE set to ``nofile`` first when given (the way a container runtime
        would: the agent starts with it); ``soft`` below it, as systemd starts a service (soft 1024)."""
        limit = f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft or nofile}, {nofile}))" if nofile else "pass"
        run = "runpy.run_module('nvdaemon', run_name='__main__')"
        boot = f"import resource, runpy, sys; {limit}; sys.argv[0] = 'nvdaemon'; {run}"
        args = ["run", "--host-root", str(self.host), "--config", str(self.config)]
        self.proc = subprocess.Popen([sys.executable, "-c", boot, *args], stdout=self.log, stderr=self.log, cwd=ROOT)
        wait_for(lambda: self.get("/readyz")[0] == 200, "readyz 200")


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[LimitedAgent]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "healthy", host, symlinks=True)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", port=free_port()))
    a = LimitedAgent(tmp_path, host, config)
    yield a
    a.kill()


def collector_failures(exposition: str) -> list[str]:
    return [
        line
        for line in exposition.splitlines()
        if line.startswith("nodevitals_collector_success{") and line.endswith(" 0.0")
    ]


def collector_errors(exposition: bytes) -> dict[tuple[tuple[str, str], ...], float]:
    """``nodevitals_collector_errors_total`` by label set, read with the project's text-format parser: it counts every
    failed read since the start, so a failure in a tick nobody scraped still shows in the next scrape."""
    family = parse_text(exposition).get("nodevitals_collector_errors_total")
    return {tuple(m.labels): m.value for m in family.metrics} if family else {}


def test_held_connections_leave_probes_and_collectors_working(agent: LimitedAgent, tmp_path: Path) -> None:
    """The issue's probe: 200 held connections against 128 descriptors. The agent serves what fits under its cap
    (RLIMIT_NOFILE less a reserve), answers /healthz over the probe lane, closes the rest, and its collectors keep
    their descriptors."""
    agent.start(nofile=NOFILE)
    exposition = agent.get("/metrics")[1]
    before, errors_before = collector_failures(exposition.decode()), collector_errors(exposition)
    assert errors_before, "no nodevitals_collector_errors_total in /metrics"
    held = []
    try:
        for _ in range(200):
            held.append(socket.create_connection(("127.0.0.1", agent.port), timeout=5))
        # Ticks of the core tier while every slot is held, counted over the probe lane: the collectors had to open
        # their files in these ticks, with the server holding every descriptor it may.
        agent.wait_ticks(3)
        status, body = wait_for(lambda: (r := agent.get("/healthz"))[0] and r, "/healthz answered")
        assert status == 200 and b'"ok"' in body
    finally:
        for sock in held:
            sock.close()
    status, body = wait_for(lambda: (r := agent.get("/metrics"))[0] == 200 and r, "/metrics served again")
    assert collector_failures(body.decode()) == before
    assert collector_errors(body) == errors_before  # no read failed in any tick, scraped or not
    assert agent.proc is not None and agent.proc.poll() is None
    log = (tmp_path / "agent.log").read_text()
    assert "Too many open files" not in log and "Traceback" not in log


def test_run_raises_the_soft_descriptor_limit_to_the_hard_one(agent: LimitedAgent) -> None:
    """As the Go runtime does for node_exporter: under systemd's soft 1024 the held pseudo files and the
    connections would share a few hundred descriptors; the hard limit is what the operator allowed."""
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)
    agent.start(nofile=hard, soft=hard // 4)
    assert agent.proc is not None
    limits = Path(f"/proc/{agent.proc.pid}/limits").read_text()
    (line,) = [ln for ln in limits.splitlines() if ln.startswith("Max open files")]
    assert line.split()[3:5] == [str(hard), str(hard)], line


def rewrite_listen(agent: LimitedAgent, port: int) -> None:
    agent.config.write_text(agent.config.read_text().replace(f"127.0.0.1:{agent.port}", f"127.0.0.1:{port}"))


def test_reload_to_an_address_in_use_keeps_the_server_and_a_free_one_binds_first(
    agent: LimitedAgent, tmp_path: Path
) -> None:
    agent.start()
    assert agent.proc is not None
    log = tmp_path / "agent.log"
    old = agent.port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        rewrite_listen(agent, busy)
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload rejected" in log.read_text(), "the reload to be rejected")
        assert agent.get("/healthz")[0] == 200  # the running server still listens on the old port
        assert f"cannot listen on 127.0.0.1 port {busy}" in log.read_text()
    agent.config.write_text(agent.config.read_text().replace(f"127.0.0.1:{busy}", f"127.0.0.1:{old}"))
    new = free_port()
    rewrite_listen(agent, new)
    agent.proc.send_signal(signal.SIGHUP)
    agent.port, agent.base = new, f"http://127.0.0.1:{new}"
    wait_for(lambda: agent.get("/healthz")[0] == 200, "/healthz on the new port")

    def old_port_closed() -> bool:
        try:
            socket.create_connection(("127.0.0.1", old), timeout=1).close()
        except ConnectionRefusedError:
            return True
        return False

    wait_for(old_port_closed, "the old port to be closed")
    # Another server setting, same address: the new server takes over the listening socket.
    listening = log.read_text().count("listening on")
    agent.config.write_text(agent.config.read_text() + "server: {maxRequestBytes: 2048}\n")
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: log.read_text().count("listening on") > listening, "the server restarted")
    wait_for(lambda: log.read_text().count("config reloaded") >= 2, "the reload done")
    assert agent.get("/healthz")[0] == 200
    assert agent.proc.poll() is None
