"""Reload never kills and never blinds: a config that cannot be read, validated or applied is rejected on SIGHUP,
counted (``/v1/status`` and ``nodevitals_config_reloads_total``), and the running config stays in force.

The agent runs as a real subprocess for the bad files (non-UTF-8, deep nesting, an alias bomb, too big, an interval
below the floor, a missing token file, a listen port another process holds). In-process tests cover what a file
cannot provoke: a state write failing with ENOSPC while a rule is retired (the trial write rejects the reload before
anything is published; a later one leaves it applied and the state saved later), an unexpected error in a reload,
and a SIGTERM during a reload.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
from pathlib import Path

import pytest
import trio
import trio.testing

from nvdaemon import reloading
from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.engine_store import ENGINE_FILE
from nvdaemon.model import COUNT_LABELS, Sample, TierSnapshot
from nvdaemon.supervise import Supervisor
from tests import test_e2e
from tests.polling import until
from tests.test_config_limits import laughs
from tests.test_e2e import Agent as AgentProcess
from tests.test_e2e import wait_for

# --- a real agent, SIGHUP with each bad file ----------------------------------------------------------------------


agent = test_e2e.agent  # the end-to-end tests' agent: fixture host "faulty", their config, a free port


def rejected_metric(agent: AgentProcess) -> float:
    status, body = agent.get("/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith('nodevitals_config_reloads_total{result="rejected"}'):
            return float(line.rpartition(" ")[2])
    raise AssertionError("no nodevitals_config_reloads_total on /metrics")


def test_bad_configs_on_sighup_are_rejected_and_the_agent_keeps_serving(agent: AgentProcess, tmp_path: Path) -> None:
    held = socket.socket()  # another process's listener, on the port a bad config asks for
    held.bind(("127.0.0.1", 0))
    held.listen()
    good = agent.config.read_text()
    bad = {
        "non-UTF-8 byte": good.encode() + b"# caf\xe9\n",
        "5000-deep nesting": (good + "node: " + "[" * 5000 + "]" * 5000 + "\n").encode(),
        "alias bomb": laughs(9).encode(),
        "over 1 MiB": good.encode() + b"#" * (2 << 20) + b"\n",
        "interval below the floor": good.replace("intervalSeconds: 0.3", "intervalSeconds: 0.000000001").encode(),
        "missing apiTokenFile": (good + f"server: {{apiTokenFile: {tmp_path / 'no-such-token'}}}\n").encode(),
        "listen port in use": good.replace(str(agent.port), str(held.getsockname()[1])).encode(),
    }
    agent.start()
    assert agent.proc is not None
    wait_for(
        lambda: ("load_high", "cpu") in {(c["condition"], c["device"]) for c in agent.status()["conditions"]}, "ENTER"
    )
    try:
        for n, (what, content) in enumerate(bad.items(), start=1):
            agent.config.write_bytes(content)
            agent.proc.send_signal(signal.SIGHUP)
            wait_for(lambda n=n: agent.status()["reloads"]["rejected"] == n, f"reload of {what} rejected")  # type: ignore[misc]
            assert agent.proc.poll() is None, what
            assert agent.get("/healthz")[0] == 200, what
            assert agent.status()["reloads"]["ok"] == 0, what
            assert rejected_metric(agent) == n, what
            assert "nodevitals_config_last_reload_successful 0.0" in agent.get("/metrics")[1].decode()
    finally:
        held.close()
    # The running config is still the old one: its rule's condition is active, its port serves.
    assert ("load_high", "cpu") in {(c["condition"], c["device"]) for c in agent.status()["conditions"]}
    agent.config.write_text(good.replace("threshold: 16", "threshold: 99"))
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: agent.status()["reloads"]["ok"] == 1, "a good reload after the bad ones")
    assert "nodevitals_config_last_reload_successful 1.0" in agent.get("/metrics")[1].decode()
    assert agent.stop()[0] == 0


# --- in process: state writes, unexpected errors, signals ----------------------------------------------------------

RULE = "  - {metric: load1, device: cpu, condition: load_high, threshold: 8}\n"


def make_agent(tmp_path: Path, rules: str = RULE) -> Agent:
    config = tmp_path / "config.yaml"
    config.write_text(write_config(tmp_path, rules))
    return Agent(parse_config(config.read_text(), str(config), env={}), config_path=str(config))


def write_config(tmp_path: Path, rules: str) -> str:
    text = (
        f"node: n1\ntiers: []\nstateDir: {tmp_path / 'state'}\nsinks: {{stream: {{enabled: false}}}}\n"
        "kernelLog: {enabled: false}\n"  # the host's kernel log (as root) would add events and seqs
        f"rules:\n{rules}"
    )
    (tmp_path / "config.yaml").write_text(text)
    return text


def enter_load_high(agent: Agent) -> None:
    agent.on_snapshot(TierSnapshot("core", [Sample("load1", "cpu", 20.0, tier="core")], {}, 1.0, 0.0))
    assert [c.condition for c in agent.engine.active.values()] == ["load_high"]


def phases(agent: Agent) -> list[str]:
    at = COUNT_LABELS.index("phase")
    return [key[at] for key, n in agent.event_counts.items() for _ in range(n)]


def no_space(path: Path, data: bytes) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


async def test_full_disk_rejects_a_reload_that_retires_a_rule_before_anything_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(tmp_path)
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        enter_load_high(agent)
        running, rules = agent.loaded, agent.rules
        write_config(tmp_path, "  []\n")  # the load rule is gone: its ENTER would need an EXIT and a state write
        monkeypatch.setattr(reloading, "atomic_write", no_space)  # the trial write before anything changes
        await agent.reload()
        assert (agent.reload_failures, agent.reloads, agent.last_reload_ok) == (1, 0, False)
        assert agent.loaded is running and agent.rules is rules
        assert phases(agent) == ["ENTER"]  # no EXIT went out
        assert [c.condition for c in agent.engine.active.values()] == ["load_high"]
        monkeypatch.undo()
        await agent.reload()  # the disk has room again
        assert (agent.reload_failures, agent.reloads, agent.last_reload_ok) == (1, 1, True)
        assert phases(agent) == ["ENTER", "EXIT"]
        assert not (agent.loaded.state_dir / reloading.PROBE_FILE).exists()
        assert (agent.loaded.state_dir / ENGINE_FILE).exists()
        nursery.cancel_scope.cancel()


async def test_state_write_failing_after_the_probe_rolls_back_to_the_running_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(tmp_path)

    def engine_file_full(path: Path, data: bytes) -> None:
        assert path.name == ENGINE_FILE
        no_space(path, data)

    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        enter_load_high(agent)
        running, rules = agent.loaded, agent.rules
        write_config(tmp_path, "  - {metric: load1, device: cpu, condition: load_very_high, threshold: 30}\n")
        monkeypatch.setattr("nvdaemon.app.atomic_write", engine_file_full)  # the agent's own state write
        await agent.reload()
        assert (agent.reload_failures, agent.reloads) == (1, 0)
        assert agent.loaded is running and agent.rules is rules
        # The EXIT was published before the write failed: the condition stays retired (a new ENTER would follow
        # if load stays high), and the state it left is saved once the disk takes it.
        assert phases(agent) == ["ENTER", "EXIT"] and not agent.engine.active
        monkeypatch.undo()
        await agent.persist_engine()
        assert (agent.loaded.state_dir / ENGINE_FILE).exists()
        enter_load_high(agent)  # the old rule is in force again
        nursery.cancel_scope.cancel()


async def test_signal_watcher_survives_an_unexpected_error_in_a_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(tmp_path)

    async def broken() -> None:
        raise RuntimeError("a bug in reload")

    monkeypatch.setattr(agent, "reload", broken)
    agent.started.set()
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.watch_signals)
        for n in (1, 2):
            os.kill(os.getpid(), signal.SIGHUP)

            def rejected(count: int = n) -> bool:
                return agent.reload_failures >= count

            await until(rejected, f"reload {n} rejected", timeout=10, step=0.01)
        os.kill(os.getpid(), signal.SIGTERM)
        with trio.fail_after(10):
            await agent.stopping.wait()
        nursery.cancel_scope.cancel()


async def test_sigterm_during_a_reload_stops_the_agent_and_cancels_the_reload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = make_agent(tmp_path)
    started, cancelled = trio.Event(), trio.Event()

    async def hanging() -> None:
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    monkeypatch.setattr(agent, "reload", hanging)
    agent.started.set()
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.watch_signals)
        os.kill(os.getpid(), signal.SIGHUP)
        with trio.fail_after(10):
            await started.wait()
        os.kill(os.getpid(), signal.SIGTERM)
        with trio.fail_after(10):
            await agent.stopping.wait()
            await cancelled.wait()
        assert agent.reload_failures == 0  # a cancelled reload is not a rejected one
        nursery.cancel_scope.cancel()


async def test_sighup_during_start_waits_for_the_start_sequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(tmp_path)
    calls: list[bool] = []

    async def record() -> None:
        calls.append(agent.started.is_set())

    monkeypatch.setattr(agent, "reload", record)
    async with trio.open_nursery() as nursery:
        await nursery.start(agent.watch_signals)
        caplog.set_level(logging.INFO, logger="nvdaemon.app")
        os.kill(os.getpid(), signal.SIGHUP)
        # The signal is in (its handler logged it), and the reload waits for the start sequence (start_tasks).
        await until(lambda: "SIGHUP: reloading config" in caplog.text, "the SIGHUP received", timeout=60, step=0.01)
        await trio.testing.wait_all_tasks_blocked()  # the reloader has taken the request and is waiting
        assert calls == []
        agent.started.set()
        await until(lambda: calls, "the reload", timeout=10, step=0.01)
        assert calls == [True]
        nursery.cancel_scope.cancel()
