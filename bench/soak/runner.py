"""The soak's runner: the agent subprocess (started, SIGHUPed, SIGKILLed and restarted, SIGTERMed), the chaos
around it, the drain once the chaos stops, and the checks of ``bench.soak.verdict`` at the end."""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.common import ROOT, BenchError, free_port, rss_kib
from bench.soak import verdict
from bench.soak.clients import Reader, StallEpisode, stall
from bench.soak.disk import StateDisk
from bench.soak.host import Host, write_atomic
from bench.soak.receiver import FlappingReceiver
from bench.soak.storm import STORM_AT, Storm, check_storm, reload_storm
from bench.soak.verdict import Check, FullPhase, Kill, LoggedEvent, Run, Verdict, parse_drops, parse_log
from nvdaemon import engine
from nvdaemon.sinks.webhook.spool import DEAD, PENDING, SpoolDB
from nvdaemon.sinks.webhook.spool import FILE as SPOOL_FILE
from tests.nvsentinel.connector import FakeConnector

NODE = "soak-node"
WEBHOOK_TIMEOUT = 2.0
GRACE = 10.0


def metric(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def proc_figures(pid: int) -> tuple[int, int] | None:
    """RSS (KiB) and open file descriptors of a process, or None when it is gone."""
    try:
        return rss_kib(pid), len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


class Soak:
    """One soak: its work directory, the agent runs, the chaos's counterparts and what they recorded."""

    def __init__(self, seconds: float, workdir: Path, seed: int = 1) -> None:
        self.seconds = seconds
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.warmup = min(60.0, max(10.0, seconds / 6))
        self.host = Host(workdir)
        self.state_dir = workdir / "state"
        self.disk = StateDisk(self.state_dir)  # its own tmpfs where root: a phase fills it
        self.full = FullPhase()
        self.state_dir_full = False  # the ballast is in place: SIGHUPs now may be refused (check_reloads)
        self.config_path = workdir / "config.yaml"
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
        self.secret = secret
        self.receiver = FlappingReceiver(secret, hang_seconds=WEBHOOK_TIMEOUT + 1.5)
        self.socket_path = workdir / "pc.sock"
        self.connector_token = workdir / "connector-token"
        self.agent_token = workdir / "agent-token"
        self.token_n = 0
        self._rotate_tokens(both=True)
        self.connector = FakeConnector(self.socket_path, NODE, self.connector_token)
        self.load_threshold = 16
        self.extra_rule = False
        self.webhook_timeout = WEBHOOK_TIMEOUT  # the reload storm flips it: each applied reload replaces the endpoint
        self.storm = Storm()
        self.runs: list[Run] = []
        self.kills_sent = 0  # SIGKILLs sent, counted before each is sent (a stalled client's episode checks it)
        self.lock = trio.Lock()  # held while signalling or replacing the agent process
        self.kill = Kill()
        self.episodes: list[StallEpisode] = []
        self.readers = [
            Reader("steady", lambda: self.port, rng=random.Random(seed + 1)),
            Reader("flaky", lambda: self.port, hold=(2.0, 6.0), rng=random.Random(seed + 2)),
            Reader("slow", lambda: self.port, slow=True, rng=random.Random(seed + 3)),
        ]
        self.reload_timeouts = 0
        self.faults = collections.Counter[str]()
        self.flaps = collections.Counter[str]()
        self.client = httpx.AsyncClient(timeout=5)

    # ---- config and process -----------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        rules: list[dict[str, Any]] = [
            {"metric": "load1", "device": "cpu", "condition": "load_high", "threshold": self.load_threshold},
            {
                "metric": "temp_celsius",
                "device": "hwmon*/coretemp/temp1",
                "condition": "cpu_package_hot",
                "severity": "critical",
                "threshold": 95,
                "op": ">=",
            },
            {
                "metric": "psi_stall_ratio_avg10",
                "device": "memory",
                "labels": {"share": "some"},
                "condition": "memory_pressure",
                "threshold": 20,
            },
            {
                "metric": "pcie_aer_fatal_total",
                "labels": {"error_type": "TOTAL_ERR_FATAL"},
                "device": "0000:*",
                "rate": True,
                "condition": "pcie_aer_fatal",
                "severity": "critical",
                "threshold": 0,
            },
            {
                "metric": "pcie_aer_correctable_total",
                "labels": {"error_type": "TOTAL_ERR_COR"},
                "device": "0000:81:*",
                "rate": True,
                "condition": "pcie_aer_correctable",
                "threshold": 0,
            },
        ]
        if self.extra_rule:
            rules.append({"metric": "load15", "device": "cpu", "condition": "soak_never", "threshold": 10_000})
        return {
            "node": NODE,
            "tiers": ["core"],
            "intervalSeconds": 1,
            "stateDir": str(self.state_dir),
            "shutdownGraceSeconds": GRACE,
            "sinks": {
                "metrics": {"listenAddr": f"127.0.0.1:{self.port}"},
                "stream": {"bufferSize": 256, "clientQueue": 64, "pingSeconds": 2, "maxClients": 16},
                "webhook": [
                    {
                        "url": self.receiver.url,
                        "secret": self.secret,
                        "timeoutSeconds": self.webhook_timeout,
                        "backoffBaseSeconds": 0.2,
                        "backoffMaxSeconds": 2,
                    }
                ],
                "nvsentinel": {
                    "enabled": True,
                    "socketPath": str(self.socket_path),
                    "tokenPath": str(self.agent_token),
                    "callTimeoutSeconds": 2,
                    "maxAttempts": 3,
                    "retryInitialSeconds": 0.2,
                },
            },
            "rules": rules,
        }

    def write_config(self) -> None:
        write_atomic(self.config_path, json.dumps(self.config(), indent=1))  # JSON is YAML

    @property
    def run(self) -> Run:
        return self.runs[-1]

    async def start_agent(self) -> None:
        index = len(self.runs) + 1
        log_path = self.workdir / f"agent-{index}.log"
        cmd = [sys.executable, "-m", "nvdaemon", "run", "--config", str(self.config_path)]
        cmd += ["--host-root", str(self.host.root), "--log-format", "json"]
        proc = await trio.to_thread.run_sync(spawn, cmd, log_path)
        self.runs.append(Run(index, proc, log_path, time.monotonic()))
        with trio.move_on_after(60):
            while proc.poll() is None:
                if (r := await self.get("/readyz")) is not None and r.status_code == 200:
                    return
                await trio.sleep(0.1)
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise BenchError(f"agent run {index} did not become ready (exit {proc.poll()}):\n{tail}")

    async def get(self, path: str) -> httpx.Response | None:
        try:
            return await self.client.get(self.base + path)
        except httpx.HTTPError:
            return None

    async def status(self) -> dict[str, Any] | None:
        r = await self.get("/v1/status")
        if r is None or r.status_code != 200:
            return None
        doc: dict[str, Any] = r.json()
        return doc

    async def slow_count(self) -> float | None:
        r = await self.get("/metrics")
        if r is None or r.status_code != 200:
            return None
        return metric(r.text, 'nodevitals_stream_disconnects_total{reason="slow"}')

    def _rotate_tokens(self, both: bool) -> str:
        self.token_n += 1
        token = f"soak-token-{self.token_n}-{os.urandom(6).hex()}"
        write_atomic(self.connector_token, token)
        if both:
            write_atomic(self.agent_token, token)
        return token

    # ---- chaos --------------------------------------------------------------------------------------------------
    async def inject_faults(self) -> None:
        step = 0
        while True:
            await trio.sleep(self.rng.uniform(1.5, 3.0))
            step += 1
            h = self.host
            if step % 6 == 0:  # the never-reading clients provoke bursts too
                self.burst()
                continue
            action = self.rng.choice(["load", "hot", "pressure", "fatal", "fatal"])
            if action == "load":
                h.set_load(not h.load_high)
            elif action == "hot":
                h.set_hot(not h.hot)
            elif action == "pressure":
                h.set_pressure(not h.pressure)
            else:
                h.bump(self.rng.choice(h.fatal_devices), "fatal")
            self.faults[action] += 1

    def burst(self) -> None:
        """A correctable AER error on every clone: 2 x CLONES events (ENTER, then EXIT a tick later)."""
        for clone in self.host.clones:
            self.host.bump(clone, "correctable")
        self.faults["correctable burst"] += 1

    async def flap_receiver(self) -> None:
        while True:
            await trio.sleep(self.rng.uniform(3.0, 8.0))
            mode = self.rng.choice(["500", "hang", "down", "down"])
            self.flaps[f"receiver {mode}"] += 1
            await trio.to_thread.run_sync(self.receiver.set_mode, mode)
            await trio.sleep(self.rng.uniform(2.0, 5.0))
            await trio.to_thread.run_sync(self.receiver.set_mode, "ok")

    async def flap_connector(self) -> None:
        while True:
            await trio.sleep(self.rng.uniform(4.0, 8.0))
            if self.rng.random() < 0.5:
                self.flaps["connector restart"] += 1
                await trio.to_thread.run_sync(self.connector.stop)
                await trio.sleep(self.rng.uniform(1.0, 4.0))
                await trio.to_thread.run_sync(self.connector.start)
            else:
                self.flaps["token rotation"] += 1
                token = self._rotate_tokens(both=False)  # the connector accepts the new token first
                await trio.sleep(self.rng.uniform(1.0, 3.0))
                write_atomic(self.agent_token, token)

    async def reload_often(self) -> None:
        while True:
            await trio.sleep(self.rng.uniform(5.0, 10.0))
            async with self.lock:
                if self.rng.random() < 0.5:
                    self.load_threshold = 33 - self.load_threshold  # 16 <-> 17: the toggled load crosses both
                else:
                    self.extra_rule = not self.extra_rule
                self.write_config()
                run = self.run
                run.reloads_sent += 1
                run.reloads_while_full += self.state_dir_full
                run.proc.send_signal(signal.SIGHUP)
                with trio.move_on_after(20) as waited:
                    while True:
                        st = await self.status()
                        if st is not None and st["reloads"]["ok"] + st["reloads"]["rejected"] >= run.reloads_sent:
                            break
                        await trio.sleep(0.2)
                if waited.cancelled_caught:
                    self.reload_timeouts += 1

    def readers_cut(self) -> int:
        """The 1013 closes the reading clients have seen (the agent's slow-disconnect count includes them)."""
        return sum(code == 1013 for reader in self.readers for code in reader.close_codes)

    async def stall_clients(self) -> None:
        while True:
            try:
                episode = await stall(
                    self.port,
                    self.slow_count,
                    self.burst,
                    patience=30,
                    others_cut=self.readers_cut,
                    kills=lambda: self.kills_sent,
                )
            except OSError:
                await trio.sleep(0.5)
                continue
            self.episodes.append(episode)
            await trio.sleep(self.rng.uniform(4.0, 8.0))

    async def fill_state_dir(self, at: float, hold: float) -> None:
        """Fill the stateDir to the last byte for ``hold`` seconds (longer, up to 3 x ``hold``, until the agent has
        shown it: the spool's WAL may still hold free pages from before, up to 4 MiB, which later writes use up
        first), watching the agent show it; then free it."""
        await trio.sleep_until(at)
        async with self.lock:  # never half-way through the restart
            self.full.ballast = await trio.to_thread.run_sync(self.disk.fill)
            self.state_dir_full = self.disk.mounted
        began = trio.current_time()
        try:
            polls = 0
            while (elapsed := trio.current_time() - began) < hold or (
                elapsed < 3 * hold and not (self.full.degraded and self.full.metric_zero)
            ):
                # A correctable burst every 2 s (the rule is a rate: ENTER on one tick, EXIT on the next, so bursts
                # closer than that keep the conditions active and write nothing): writes that need new space.
                if polls % 4 == 0:
                    self.burst()
                polls += 1
                await trio.sleep(0.5)
                st = await self.status()
                sinks: dict[str, Any] = (st or {}).get("sinks", {})
                hook: dict[str, Any] = next((v for k, v in sinks.items() if k.startswith("webhook:")), {})
                if hook.get("state") == "degraded" and hook.get("stateWritable") is False:
                    self.full.degraded = True
                self.full.unspooled_max = max(self.full.unspooled_max, int(hook.get("unspooled") or 0))
                r = await self.get("/metrics")
                if r is not None and any(
                    line.startswith("nodevitals_sink_state_writable{") and line.endswith(" 0.0")
                    for line in r.text.splitlines()
                ):
                    self.full.metric_zero = True
        finally:
            self.disk.free()  # also when the chaos ends first
            self.state_dir_full = False
            self.full.seconds = trio.current_time() - began

    async def sample(self) -> None:
        while True:
            run = self.run
            if run.proc.poll() is None and (fig := proc_figures(run.proc.pid)) is not None:
                run.samples.append((time.monotonic() - run.started, *fig))
            await trio.sleep(1)

    async def kill_and_restart(self, at: float) -> None:
        await trio.sleep_until(at)
        async with self.lock:
            with trio.CancelScope(shield=True):
                st = await self.status()
                if st is not None:
                    self.run.reloads = dict(st["reloads"])
                self.kills_sent += 1
                self.run.proc.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(self.run.proc.wait)
                self.kill.at = time.monotonic()
                self.kill.seq = engine.load_state((self.state_dir / "engine.json").read_bytes()).seq
                self.kill.emitted = st["eventSeq"] if st is not None else None
                db = SpoolDB(self.state_dir / SPOOL_FILE)
                try:
                    self.kill.spooled = {r.event_id for r in db.rows()}
                finally:
                    db.close()
                await self.start_agent()

    # ---- the whole soak -------------------------------------------------------------------------------------------
    async def main(self) -> Verdict:
        await trio.to_thread.run_sync(self.disk.mount)
        self.full.skipped = self.disk.skipped
        self.write_config()
        await trio.to_thread.run_sync(self.receiver.set_mode, "ok")
        await trio.to_thread.run_sync(self.connector.start)
        began = trio.current_time()
        await self.start_agent()
        try:
            async with trio.open_nursery() as watchers:
                watchers.start_soon(self.sample)
                async with trio.open_nursery() as chaos:
                    for task in (
                        self.inject_faults,
                        self.flap_receiver,
                        self.flap_connector,
                        self.reload_often,
                        self.stall_clients,
                    ):
                        chaos.start_soon(task)
                    for reader in self.readers:
                        chaos.start_soon(reader.run)
                    chaos.start_soon(self.kill_and_restart, began + self.seconds / 2)
                    chaos.start_soon(reload_storm, self, self.storm, began + self.seconds * STORM_AT)
                    if self.disk.mounted:  # after the restart, well before the end
                        hold = max(8.0, self.seconds / 10)
                        chaos.start_soon(self.fill_state_dir, began + self.seconds * 0.6, hold)
                    await trio.sleep_until(began + self.seconds)
                    async with self.lock:  # no SIGHUP or restart half done
                        chaos.cancel_scope.cancel()
                checks = await self.calm_drain_and_stop()
                watchers.cancel_scope.cancel()
        finally:
            await self.client.aclose()
            with contextlib.suppress(Exception):
                await trio.to_thread.run_sync(self.receiver.close)
            with contextlib.suppress(Exception):
                await trio.to_thread.run_sync(self.connector.stop)
            for run in self.runs:
                if run.proc.poll() is None:
                    run.proc.kill()
                    run.proc.wait()
            await trio.to_thread.run_sync(self.disk.unmount, self.workdir / "state-final")
        return Verdict(self.seconds, checks, self.workdir, self.summary())

    async def calm_drain_and_stop(self) -> list[Check]:
        """Stop the chaos, let the agent drain, settle, SIGTERM it; return every check."""
        await trio.to_thread.run_sync(self.receiver.set_mode, "ok")
        if self.connector.server is None:
            await trio.to_thread.run_sync(self.connector.start)
        write_atomic(self.agent_token, self.connector_token.read_text())
        h = self.host
        h.set_hot(True)  # one critical condition active at the end, so check 3 compares something
        h.set_load(True)
        h.set_pressure(False)
        calm = trio.current_time()
        # Delivery is one request at a time; after 10 minutes with the receiver down a third of the time the backlog
        # is thousands of events (about 270 s to drain on 2 CPUs), so the deadline grows with the soak.
        drained, state = await self.drain(deadline=calm + max(180.0, self.seconds))
        drain_seconds = trio.current_time() - calm
        # Settle: nothing happens for a while; a task that keeps restarting shows it here.
        before = state["tasks"] if state else {}
        await trio.sleep(8)
        after = await self.status() or {}
        health = await self.get("/healthz")
        final = dict(after)
        self.run.reloads = dict(final.get("reloads", {}))
        # SIGTERM
        began = time.monotonic()
        self.run.proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = await trio.to_thread.run_sync(lambda: self.run.proc.wait(GRACE + 15))
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - began
        # Logs and the spool, now that the agent is gone.
        logged: list[LoggedEvent] = []
        errors: list[str] = []
        for run in self.runs:
            events, errs = parse_log(run.index, run.log_path)
            logged += events
            errors += errs
        pending = dead = 0
        db = SpoolDB(self.state_dir / SPOOL_FILE)
        try:
            rows = db.rows()
            pending = sum(r.state == PENDING for r in rows)
            dead = sum(r.state == DEAD for r in rows)
        finally:
            db.close()
        receipts = self.receiver.snapshot()
        must = self.must_deliver(logged)
        return [
            verdict.check_delivery(logged, must, receipts, self.receiver, self.kill, drained, drain_seconds),
            verdict.check_accounting(logged, receipts, self.drops(), must, final),
            verdict.check_full_state_dir(self.full, final),
            verdict.check_receiver_view(receipts, final),
            verdict.check_connector(self.connector, final),
            verdict.check_stream(self.readers, self.episodes, logged),
            verdict.check_reloads(self.runs, self.reload_timeouts),
            check_storm(self.storm),
            verdict.check_tasks(before, final, health.status_code if health else None),
            *verdict.check_resources(self.runs, self.warmup),
            Check(
                "exit on SIGTERM",
                code == 0 and took <= GRACE,
                f"exit code {code} after {took:.1f} s (grace {GRACE:g} s); spool afterwards: {pending} pending, "
                f"{dead} dead letters; error lines logged: {len(errors)}"
                + (f" (first: {errors[0]!r})" if errors else ""),
            ),
            Check("spool empty after exit", pending == 0 and dead == 0, f"{pending} pending, {dead} dead letters"),
        ]

    def must_deliver(self, logged: list[LoggedEvent]) -> set[str]:
        """What must be acked: see ``verdict.must_deliver``, less what the agent dropped and counted (by id)."""
        dropped = {i for run in self.drops().values() for i in run}
        return verdict.must_deliver(logged, len(self.runs), self.kill) - dropped

    def drops(self) -> dict[int, dict[str, str]]:
        return {run.index: parse_drops(run.log_path) for run in self.runs}

    async def drain(self, deadline: float) -> tuple[bool, dict[str, Any] | None]:
        """Wait until the webhook backlog and the NVSentinel differences are gone, every durable event is acked,
        the connector shows the engine's conditions, and no event was emitted for two samples."""
        last_seq = -1
        state: dict[str, Any] | None = None
        while trio.current_time() < deadline:
            await trio.sleep(1)
            state = await self.status()
            if state is None:
                continue
            logged = [e for run in self.runs for e in parse_log(run.index, run.log_path)[0]]
            missing = self.must_deliver(logged) - self.receiver.acked_ids()
            hook = next(v for k, v in state["sinks"].items() if k.startswith("webhook:"))
            quiet = state["eventSeq"] == last_seq
            last_seq = state["eventSeq"]
            if (
                quiet
                and hook["backlog"] == 0
                and state["sinks"]["nvsentinel"]["pending"] == 0
                and not missing
                and not verdict.connector_diff(self.connector, state)
            ):
                return True, state
        return False, state

    def summary(self) -> str:
        return (
            f"faults {dict(sorted(self.faults.items()))}; flaps {dict(sorted(self.flaps.items()))}; "
            f"agent runs {len(self.runs)}"
        )


def spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT)


def run_soak(seconds: float, workdir: Path | None = None, seed: int = 1) -> Verdict:
    """Run the soak for ``seconds`` of chaos (plus start, drain and stop) and return the verdict."""
    own = workdir is None
    path = Path(tempfile.mkdtemp(prefix="nvdaemon-soak-")) if workdir is None else workdir
    soak = Soak(seconds, path, seed)
    result = trio.run(soak.main)
    if own and result.passed:
        shutil.rmtree(path, ignore_errors=True)
    return result
