"""A reload storm: the real agent (``nvdaemon run``) gets SIGHUP after SIGHUP, alternating two valid configs that
keep the same webhook endpoint but differ in its ``timeoutSeconds``, so every applied reload replaces the endpoint,
while the fixture host's load flips on every tick so that each tick emits events.

What must hold, whatever the timing: every event the engine emitted (the agent logs each one before publishing it)
reached the real receiver on loopback, or is counted in ``nodevitals_delivery_dropped_total`` and logged by id; that
counter never goes down; and ``/healthz`` stays 200 while the tier loop keeps completing ticks (the storm lasts a
number of ticks, not a wall-clock time).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sinks.helpers import SECRET
from tests.sinks.receiver import Receiver
from tests.test_e2e import ROOT, Agent, free_port, wait_for

RELOADS = 200  # SIGHUPs at least
TICKS = 25  # ticks of the core tier the storm lasts at least
CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.2
stateDir: {state}
shutdownGraceSeconds: 5
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  webhook:
    - {{url: "{url}", secret: "{secret}", timeoutSeconds: {timeout}, backoffBaseSeconds: 0.05, backoffMaxSeconds: 0.2}}
rules:
  - {{metric: load1, device: cpu, condition: load1_high, threshold: 5}}
  - {{metric: load5, device: cpu, condition: load5_high, threshold: 5}}
  - {{metric: load15, device: cpu, condition: load15_high, threshold: 5}}
"""
EVENT_LINE = re.compile(r"nvdaemon\.events: event \w+ .* id=(\S+)")
DROPPED_LINE = re.compile(r"dropped \d+ event\(s\) \((\w+)\): (.*)$", re.M)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def dropped_total(agent: Agent) -> float:
    status, body = agent.get("/metrics")
    assert status == 200
    lines = [ln for ln in body.decode().splitlines() if ln.startswith("nodevitals_delivery_dropped_total{")]
    return sum(float(ln.rpartition(" ")[2]) for ln in lines)


@pytest.fixture
def storm(tmp_path: Path) -> Iterator[tuple[Agent, Receiver, list[str]]]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    port = free_port()
    with Receiver(secret=SECRET) as rx:
        configs = [
            CONFIG.format(state=tmp_path / "state", port=port, url=rx.url, secret=SECRET, timeout=t) for t in (5, 6)
        ]
        config = tmp_path / "config.yaml"
        config.write_text(configs[0])
        agent = Agent(tmp_path, host, config)
        try:
            yield agent, rx, configs
        finally:
            agent.kill()


@pytest.mark.e2e
def test_a_reload_storm_replacing_the_webhook_endpoint_loses_no_event_and_keeps_healthz(
    storm: tuple[Agent, Receiver, list[str]], tmp_path: Path
) -> None:
    agent, rx, configs = storm
    agent.start()
    assert agent.proc is not None
    loadavg = agent.host / "proc" / "loadavg"
    high = True
    first = agent.ticks()
    assert first is not None
    last_tick, sent, failed_health = first, 0, []
    drops: list[float] = [dropped_total(agent)]
    while sent < RELOADS or last_tick < first + TICKS:
        write_atomic(agent.config, configs[sent % 2])
        agent.proc.send_signal(signal.SIGHUP)
        sent += 1
        status, body = agent.get("/healthz")
        if status != 200:
            failed_health.append(body.decode(errors="replace"))
        ticks = agent.ticks() or last_tick
        if ticks != last_tick:  # a tick saw the last value: flip the load (three conditions ENTER or EXIT)
            high = not high
            write_atomic(loadavg, "24.51 18.32 9.87 27/1310 223344\n" if high else "0.50 0.40 0.30 27/1310 223344\n")
            last_tick = ticks
        if sent % 10 == 0:
            drops.append(dropped_total(agent))
    agent.wait_ticks(3)  # the last flip is seen; then every emitted event is spooled, delivered or dropped

    def log_text() -> str:
        return (tmp_path / "agent.log").read_text(errors="replace")

    def emitted() -> set[str]:
        return set(EVENT_LINE.findall(log_text()))

    def logged_drops() -> set[str]:
        return {i for m in DROPPED_LINE.finditer(log_text()) for i in m.group(2).split()}

    wait_for(lambda: emitted() <= set(rx.ids()) | logged_drops(), "every emitted event delivered or dropped")
    drops.append(dropped_total(agent))
    code, _ = agent.stop()
    assert code == 0
    lost = emitted() - set(rx.ids())
    assert len(emitted()) >= TICKS  # the storm did emit: about three events per tick
    problems = []  # all of them, not only the first
    if len(lost) > drops[-1]:
        problems.append(f"{len(lost)} event(s) lost, {drops[-1]:g} counted as dropped: {sorted(lost)}")
    if drops != sorted(drops):
        problems.append(f"nodevitals_delivery_dropped_total went down: {drops}")
    if failed_health:
        problems.append(f"/healthz failed {len(failed_health)} time(s) of {sent}: {failed_health[:2]}")
    assert not problems, "\n".join(problems)
