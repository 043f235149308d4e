"""``make soak``: the agent under sustained chaos for ``SOAK_SECONDS`` (default 600), then a verdict.

The real agent (``nvdaemon run``, a subprocess) runs on a copy of ``fixtures/hosts/faulty`` (plus 64 cloned PCI
devices, so a burst of correctable AER errors makes 64 ENTERs and 64 EXITs at once) with ``intervalSeconds: 1`` and
its ``stateDir`` in the soak's work directory. While it runs:

- **faults**: every 1.5-3 s the host's files change: load high/low, the CPU package hot/cool (critical), memory
  pressure up/down, a fatal AER error on one device (critical; a rate rule, so ENTER then EXIT), a correctable burst;
- **webhook receiver** (``bench/soak/receiver.py``) flaps: ok, 500s, hangs longer than ``timeoutSeconds``, down;
- **platform-connector** (``tests/nvsentinel/connector.py``, real gRPC on a Unix socket) restarts, and rotates its
  token: it accepts the new one 1-3 s before the agent's token file has it;
- **websocket clients** (``bench/soak/clients.py``): one reader that stays, one that disconnects and resumes with
  ``since=`` every few seconds, one that reads slowly through tiny socket buffers (the agent's sends to it block),
  and a client that never reads (it must be cut with 1013, nobody waiting for it);
- **SIGHUP** every 5-10 s with a harmless config change (the load threshold 16 <-> 17, which the toggled load
  crosses either way; a rule that never fires added or removed);
- **SIGKILL** half-way, then a restart on the same stateDir.

Then the chaos stops (receiver ok, connector up with the agent's token, files frozen with the CPU still hot), the
agent drains, and the soak checks (figures for each; any FAIL makes the verdict fail):

1. every event the engine emitted and made durable was acked by the receiver (by id); duplicates are counted and
   allowed only across the kill (or right after the receiver cut the connection the ack went out on);
2. the receiver's view (the last phase per condition and device) equals the engine's active conditions;
3. the platform-connector's node conditions equal the engine's active critical conditions;
4. the never-reading client was cut as slow and got the 1013 close frame once it read, the agent dropped every
   such connection, and the readers saw every event of a run in order, with no gap or duplicate, across their
   ``since=`` resumes too;
5. every SIGHUP was applied (``reloads.ok``), none rejected;
6. no task is stuck restarting: all running at the end, no restart while the agent settled, ``/healthz`` 200;
7. RSS and open fds did not grow after the warm-up (per agent process: the SIGKILL restart starts a new baseline);
8. SIGTERM: exit 0 within ``shutdownGraceSeconds``; afterwards the spool holds no pending event and no dead letter.

Where "every event the engine emitted" comes from: the agent logs each event (logger ``nvdaemon.events``, JSON with
the event) in ``Agent.emit`` *before* publishing it to the bus, so the two runs' logs list every event emitted, by
id and seq. Not all of them must arrive: the agent saves its engine state (``engine.json``) only once the webhook
spool has committed every event up to that state's seq, so a SIGKILL can lose an event that was emitted but not yet
spooled; the engine then never saved the transition and detects it again after the restart (at-least-once, as
designed). The events that must arrive are therefore: every event of the final run (SIGTERM drains the bus into the
spool), every event of the killed run with a seq up to the seq of the ``engine.json`` found after the kill, and
every event found in the spool after the kill (read before the restart). Anything else from the killed run is
reported as "lost with the kill"; check 2 then shows the restart re-detected what mattered.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import itertools
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.soak.clients import Reader, StallEpisode, stall
from bench.soak.receiver import FlappingReceiver, Receipt
from nvdaemon import engine
from nvdaemon.sinks.spool import DEAD, PENDING, SpoolDB
from nvdaemon.sinks.spool import FILE as SPOOL_FILE
from tests.nvsentinel.connector import FakeConnector

ROOT = Path(__file__).resolve().parent.parent.parent
NODE = "soak-node"
CLONES = 64  # cloned PCI devices: a correctable burst is 64 ENTERs, then 64 EXITs
WEBHOOK_TIMEOUT = 2.0
GRACE = 10.0
RSS_TOLERANCE_KIB = 8 * 1024  # RSS may grow by at most this much after the warm-up, per agent process
FD_TOLERANCE = 10  # open file descriptors likewise


class SoakError(RuntimeError):
    """The soak could not run (the agent did not start); the message says why."""


@dataclass
class Check:
    name: str
    ok: bool
    figures: str


@dataclass
class Verdict:
    seconds: float
    checks: list[Check]
    workdir: Path
    notes: str = ""

    @property
    def passed(self) -> bool:
        return all(c.ok for c in self.checks)

    def render(self) -> str:
        lines = [f"soak: {self.seconds:g} s of chaos, work directory {self.workdir}"]
        if self.notes:
            lines.append(f"  {self.notes}")
        lines += [f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.figures}" for c in self.checks]
        lines.append(f"verdict: {'PASS' if self.passed else 'FAIL'}")
        return "\n".join(lines)


@dataclass
class Run:
    """One agent process."""

    index: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float  # time.monotonic()
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds since start, RSS KiB, fds)
    reloads_sent: int = 0
    reloads: dict[str, int] = field(default_factory=dict)  # the agent's own count, read at the end of the run


@dataclass
class LoggedEvent:
    run: int
    position: int  # order of emission within its run
    id: str
    seq: int
    condition: str
    device: str
    phase: str
    severity: str


# ---- the fixture host ---------------------------------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    """Replace a file in one step, so the agent never reads half of it."""
    tmp = path.with_name(f".{path.name}.soak")
    tmp.write_text(text)
    os.replace(tmp, path)


class Host:
    """A copy of fixtures/hosts/faulty whose files the soak changes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", root, symlinks=True)
        boot = root / "proc" / "sys" / "kernel" / "random" / "boot_id"
        boot.parent.mkdir(parents=True)
        boot.write_text("5a5a5a5a-0000-4000-8000-000000000001\n")
        hwmon = root / "sys" / "class" / "hwmon"
        self.coretemp = next(p for p in hwmon.iterdir() if (p / "name").read_text().strip() == "coretemp")
        pci = root / "sys" / "bus" / "pci" / "devices"
        template = pci / "0000:3b:00.0"
        self.clones: list[Path] = []
        for i in range(CLONES):
            clone = pci / f"0000:81:{i:02x}.0"
            shutil.copytree(template, clone)
            self.clones.append(clone)
        self.fatal_devices = sorted(p for p in pci.iterdir() if (p / "aer_dev_fatal").exists())
        self.counters: dict[Path, int] = {}
        self.load_high = self.hot = self.pressure = True

    def set_load(self, high: bool) -> None:
        self.load_high = high
        write_atomic(self.root / "proc" / "loadavg", f"{'24.51' if high else '0.50'} 18.32 9.87 27/1310 223344\n")

    def set_hot(self, hot: bool) -> None:
        self.hot = hot
        write_atomic(self.coretemp / "temp1_input", "97000\n" if hot else "60000\n")

    def set_pressure(self, high: bool) -> None:
        self.pressure = high
        some = "35.12" if high else "1.05"
        write_atomic(
            self.root / "proc" / "pressure" / "memory",
            f"some avg10={some} avg60=28.40 avg300=12.07 total=987654321\n"
            "full avg10=21.55 avg60=17.80 avg300=7.43 total=654321098\n",
        )

    def bump(self, device: Path, kind: str) -> None:
        """One more AER error of ``kind`` (fatal, correctable) on ``device``: its TOTAL_ line goes up by one."""
        path = device / f"aer_dev_{kind}"
        text = path.read_text()
        total = re.search(r"^(TOTAL_ERR_\w+) (\d+)$", text, re.M)
        assert total is not None
        n = int(total.group(2)) + 1
        write_atomic(path, text[: total.start(2)] + str(n) + text[total.end(2) :])


# ---- reading the agent ----------------------------------------------------------------------------------------------
def parse_log(run: int, path: Path) -> tuple[list[LoggedEvent], list[str]]:
    """The events a run's JSON log lists (in emission order), and its error lines."""
    events: list[LoggedEvent] = []
    errors: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(doc, dict):
            continue
        if doc.get("logger") == "nvdaemon.events" and isinstance(ev := doc.get("event"), dict):
            events.append(
                LoggedEvent(
                    run,
                    len(events),
                    ev["id"],
                    int(ev["seq"]),
                    ev["condition"],
                    ev["device"],
                    ev["phase"],
                    ev["severity"],
                )
            )
        elif doc.get("level") in ("error", "critical"):
            errors.append(str(doc.get("msg", ""))[:160])
    return events, errors


def metric(text: str, series: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def check_name(condition: str) -> str:
    return "Nvdaemon" + "".join(part.capitalize() for part in condition.split("_"))


def proc_figures(pid: int) -> tuple[int, int] | None:
    """RSS (KiB) and open file descriptors of a process, or None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return rss, fds


# ---- the soak -------------------------------------------------------------------------------------------------------
class Soak:
    def __init__(self, seconds: float, workdir: Path, seed: int = 1) -> None:
        self.seconds = seconds
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.warmup = min(60.0, max(10.0, seconds / 6))
        self.host = Host(workdir / "host")
        self.state_dir = workdir / "state"
        self.config_path = workdir / "config.yaml"
        self.port = _free_port()
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
        self.runs: list[Run] = []
        self.lock = trio.Lock()  # held while signalling or replacing the agent process
        self.kill_at: float | None = None  # time.monotonic() of the SIGKILL
        self.kill_seq = 0  # engine.json seq after the SIGKILL
        self.spooled_at_kill: set[str] = set()
        self.kill_emitted: int | None = None  # the engine's seq shortly before the SIGKILL
        self.drain_seconds = 0.0
        self.episodes: list[tuple[int, StallEpisode]] = []
        self.readers = [
            Reader("steady", lambda: self.port, rng=random.Random(seed + 1)),
            Reader("flaky", lambda: self.port, hold=(2.0, 6.0), rng=random.Random(seed + 2)),
            Reader("slow", lambda: self.port, slow=True, rng=random.Random(seed + 3)),
        ]
        self.reload_timeouts = 0
        self.gap_examples: list[str] = []
        self.faults = collections.Counter[str]()
        self.flaps = collections.Counter[str]()
        self.client = httpx.AsyncClient(timeout=5)

    # ---- config and process -----------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        rules: list[dict[str, Any]] = [
            {"metric": "load1", "device": "cpu", "condition": "load_high", "threshold": self.load_threshold},
            {
                "metric": "temp_celsius",
                "device": "coretemp",
                "labels": {"sensor": "Package id 0"},
                "condition": "cpu_package_hot",
                "severity": "critical",
                "threshold": 95,
                "op": ">=",
            },
            {
                "metric": "psi_avg10_pct",
                "device": "memory",
                "labels": {"kind": "some"},
                "condition": "memory_pressure",
                "threshold": 20,
            },
            {
                "metric": "pcie_aer_fatal_total",
                "device": "0000:*",
                "rate": True,
                "condition": "pcie_aer_fatal",
                "severity": "critical",
                "threshold": 0,
            },
            {
                "metric": "pcie_aer_correctable_total",
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
                        "timeoutSeconds": WEBHOOK_TIMEOUT,
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
        proc = spawn(cmd, log_path)
        self.runs.append(Run(index, proc, log_path, time.monotonic()))
        with trio.move_on_after(60):
            while proc.poll() is None:
                if (r := await self.get("/readyz")) is not None and r.status_code == 200:
                    return
                await trio.sleep(0.1)
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-25:])
        raise SoakError(f"agent run {index} did not become ready (exit {proc.poll()}):\n{tail}")

    async def get(self, path: str) -> httpx.Response | None:
        try:
            return await self.client.get(self.base + path)
        except httpx.HTTPError:
            return None

    async def state(self) -> dict[str, Any] | None:
        r = await self.get("/v1/state")
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
                run.proc.send_signal(signal.SIGHUP)
                with trio.move_on_after(20) as waited:
                    while True:
                        st = await self.state()
                        if st is not None and st["reloads"]["ok"] + st["reloads"]["rejected"] >= run.reloads_sent:
                            break
                        await trio.sleep(0.2)
                if waited.cancelled_caught:
                    self.reload_timeouts += 1

    async def stall_clients(self) -> None:
        while True:
            index = self.run.index
            try:
                episode = await stall(self.port, self.slow_count, self.burst, patience=30)
            except OSError:
                await trio.sleep(0.5)
                continue
            self.episodes.append((index, episode))
            await trio.sleep(self.rng.uniform(4.0, 8.0))

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
                st = await self.state()
                if st is not None:
                    self.run.reloads = dict(st["reloads"])
                self.run.proc.send_signal(signal.SIGKILL)
                await trio.to_thread.run_sync(self.run.proc.wait)
                self.kill_at = time.monotonic()
                self.kill_seq = engine.load_state((self.state_dir / "engine.json").read_bytes()).seq
                self.kill_emitted = st["eventSeq"] if st is not None else None
                db = SpoolDB(self.state_dir / SPOOL_FILE)
                try:
                    self.spooled_at_kill = {r.event_id for r in db.rows()}
                finally:
                    db.close()
                await self.start_agent()

    # ---- the whole soak -------------------------------------------------------------------------------------------
    async def main(self) -> Verdict:
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
        self.drain_seconds = trio.current_time() - calm
        # Settle: nothing happens for a while; a task that keeps restarting shows it here.
        before = state["tasks"] if state else {}
        await trio.sleep(8)
        after = await self.state() or {}
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
        return [
            self.check_delivery(logged, receipts, drained),
            self.check_receiver_view(receipts, final),
            self.check_connector(final),
            self.check_stream(logged),
            self.check_reloads(),
            self.check_tasks(before, final, health.status_code if health else None),
            *self.check_resources(),
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
        last = len(self.runs)
        return {
            e.id
            for e in logged
            if e.run == last or (e.run < last and (e.seq <= self.kill_seq or e.id in self.spooled_at_kill))
        }

    async def drain(self, deadline: float) -> tuple[bool, dict[str, Any] | None]:
        """Wait until the webhook backlog and the NVSentinel differences are gone, every durable event is acked,
        the connector shows the engine's conditions, and no event was emitted for two samples."""
        last_seq = -1
        state: dict[str, Any] | None = None
        while trio.current_time() < deadline:
            await trio.sleep(1)
            state = await self.state()
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
                and not self.connector_diff(state)
            ):
                return True, state
        return False, state

    # ---- checks ---------------------------------------------------------------------------------------------------
    def check_delivery(self, logged: list[LoggedEvent], receipts: list[Receipt], drained: bool) -> Check:
        must = self.must_deliver(logged)
        acks: dict[str, list[Receipt]] = collections.defaultdict(list)
        for r in receipts:
            if r.answered == "200" and r.event_id:
                acks[r.event_id].append(r)
        emitted = {e.id for e in logged}
        missing = must - acks.keys()
        unknown = acks.keys() - emitted
        lost = emitted - must - acks.keys()
        across = after_cut = unexplained = 0
        for rs in acks.values():
            for prev, again in itertools.pairwise(rs):
                if self.kill_at is not None and prev.at < self.kill_at < again.at:
                    across += 1
                elif self.receiver.unconfirmed(prev):
                    after_cut += 1
                else:
                    unexplained += 1
        bad = sum(r.answered in ("401", "400") for r in receipts)
        answered = collections.Counter(r.answered for r in receipts)
        ok = drained and not missing and not unknown and not unexplained and not bad
        return Check(
            "webhook: every durable event acked",
            ok,
            f"{len(emitted)} emitted, {len(must)} durable, {len(missing)} missing, {len(unknown)} acked but never "
            f"emitted, {len(lost)} lost with the kill (emitted after the last state save, never spooled); "
            f"duplicates: {across} across the kill, {after_cut} after a cut, {unexplained} unexplained; "
            f"requests {dict(sorted(answered.items()))}; SIGKILL at seq ~{self.kill_emitted} with state saved up to "
            f"seq {self.kill_seq} and {len(self.spooled_at_kill)} events in the spool; drained: {drained} "
            f"({self.drain_seconds:.0f} s)",
        )

    def check_receiver_view(self, receipts: list[Receipt], final: dict[str, Any]) -> Check:
        seen: set[str] = set()
        active: set[tuple[str, str]] = set()
        for r in receipts:
            if r.answered != "200" or not r.event_id or r.event_id in seen or r.data is None:
                continue
            seen.add(r.event_id)
            key = (str(r.data["condition"]), str(r.data["device"]))
            if r.data["phase"] == "ENTER":
                active.add(key)
            else:
                active.discard(key)
        engine = {(c["condition"], c["device"]) for c in final.get("conditions", [])}
        return Check(
            "webhook view = engine conditions",
            bool(final) and active == engine,
            f"{len(engine)} active in the engine, {len(active)} per the receiver; only engine: "
            f"{sorted(engine - active)}, only receiver: {sorted(active - engine)}",
        )

    def connector_diff(self, state: dict[str, Any]) -> list[str]:
        expected: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter(
            (check_name(c["condition"]), (c["condition"],)) for c in state["conditions"] if c["severity"] == "critical"
        )
        actual: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter()
        with self.connector.lock:
            for cond in self.connector.conditions.values():
                if cond.status == "True":
                    for _, codes in cond.entries:
                        actual[(cond.type, codes)] += 1
        return [f"{k[0]} x{n}" for k, n in (expected - actual).items()] + [
            f"extra {k[0]} x{n}" for k, n in (actual - expected).items()
        ]

    def check_connector(self, final: dict[str, Any]) -> Check:
        diff = self.connector_diff(final) if final else ["no final state"]
        nv = final.get("sinks", {}).get("nvsentinel", {})
        true = sorted(c.type for c in self.connector.conditions.values() if c.status == "True")
        calls = collections.Counter(r.code for r in self.connector.calls())
        return Check(
            "platform-connector conditions = engine critical conditions",
            not diff and nv.get("pending") == 0,
            f"True conditions {true}; differences {diff}; agent pending {nv.get('pending')}; "
            f"calls {dict(sorted(calls.items()))}",
        )

    def check_stream(self, logged: list[LoggedEvent]) -> Check:
        where = {e.id: (e.run, e.position) for e in logged}
        problems: list[str] = []
        figures: list[str] = []
        for reader in self.readers:
            unknown = gaps = disorder = 0
            prev: tuple[int, int] | None = None
            prev_conn = 0
            for conn, event_id in reader.received:
                at = where.get(event_id)
                if at is None:
                    unknown += 1
                    continue
                reset = conn != prev_conn and conn in reader.unknown_cursor
                if prev is not None and prev[0] == at[0] and not reset:
                    if at[1] <= prev[1]:
                        disorder += 1
                    elif at[1] != prev[1] + 1:
                        gaps += 1
                        if len(self.gap_examples) < 5:
                            self.gap_examples.append(f"{reader.name} run {at[0]} #{prev[1]} -> #{at[1]}")
                prev, prev_conn = at, conn
            slow = reader.close_codes.count(1013)
            figures.append(
                f"{reader.name}: {len(reader.received)} events over {reader.connections} connections "
                f"({slow} closed 1013), {gaps} gaps, {disorder} repeated or out of order, {unknown} unknown"
            )
            if unknown or gaps or disorder or not reader.received:
                problems.append(reader.name)
        done = [e for _, e in self.episodes if not e.agent_restarted]
        kicked = [e for e in done if e.kicked]
        endings = collections.Counter(e.ending for e in kicked)
        figures.append(
            f"never-reading clients: {len(done)} (+{len(self.episodes) - len(done)} ended by the SIGKILL), cut as "
            f"slow {len(kicked)} (what they read at the end: {dict(endings)}), dropped otherwise (TCP_USER_TIMEOUT) "
            f"{sum(e.dropped and not e.kicked for e in done)}, never dropped {sum(not e.dropped for e in done)}"
        )
        no_frame = [e for e in kicked if e.prompt and e.ending != "close:1013"]
        if not kicked or no_frame or not all(e.dropped for e in done):
            problems.append("never-reading clients")
        if self.gap_examples:
            figures.append(f"gaps: {', '.join(self.gap_examples)}")
        return Check("stream clients", not problems, "; ".join(figures))

    def check_reloads(self) -> Check:
        parts = []
        ok = self.reload_timeouts == 0
        for run in self.runs:
            got = run.reloads.get("ok", -1)
            rejected = run.reloads.get("rejected", -1)
            ok = ok and got == run.reloads_sent and rejected == 0
            parts.append(f"run {run.index}: {run.reloads_sent} SIGHUPs, {got} applied, {rejected} rejected")
        return Check("SIGHUP reloads", ok, "; ".join(parts) + f"; timeouts {self.reload_timeouts}")

    def check_tasks(self, before: dict[str, Any], final: dict[str, Any], health: int | None) -> Check:
        tasks = final.get("tasks", {})
        not_running = sorted(n for n, t in tasks.items() if t["state"] != "running")
        grew = sorted(n for n, t in tasks.items() if t["restarts"] != before.get(n, {}).get("restarts"))
        restarts = {n: t["restarts"] for n, t in tasks.items() if t["restarts"]}
        return Check(
            "no task stuck restarting",
            bool(tasks) and not not_running and not grew and health == 200,
            f"{len(tasks)} tasks; not running {not_running}; restarted while settling {grew}; restarts in the "
            f"final run {restarts}; /healthz {health}",
        )

    def check_resources(self) -> list[Check]:
        checks = []
        for run in self.runs:
            measured = [s for s in run.samples if s[0] >= self.warmup]
            if len(measured) < 6:
                checks.append(Check(f"RSS and fds, run {run.index}", False, f"{len(measured)} samples only"))
                continue
            span = measured[-1][0] - measured[0][0]
            window = max(5.0, span / 4)
            head = [s for s in measured if s[0] <= measured[0][0] + window]
            tail = [s for s in measured if s[0] >= measured[-1][0] - window]
            rss0, rss1 = statistics.median(s[1] for s in head), statistics.median(s[1] for s in tail)
            fd0, fd1 = statistics.median(s[2] for s in head), statistics.median(s[2] for s in tail)
            rss_max = max(s[1] for s in measured)
            fd_max = max(s[2] for s in measured)
            checks.append(
                Check(
                    f"RSS and fds, run {run.index}",
                    rss1 - rss0 <= RSS_TOLERANCE_KIB and fd1 - fd0 <= FD_TOLERANCE,
                    f"after {self.warmup:g} s warm-up, over {span:.0f} s ({len(measured)} samples): RSS "
                    f"{rss0 / 1024:.1f} -> {rss1 / 1024:.1f} MiB (max {rss_max / 1024:.1f}, tolerance "
                    f"+{RSS_TOLERANCE_KIB / 1024:g}), fds {fd0:g} -> {fd1:g} (max {fd_max}, tolerance +{FD_TOLERANCE})",
                )
            )
        return checks

    def summary(self) -> str:
        return (
            f"faults {dict(sorted(self.faults.items()))}; flaps {dict(sorted(self.flaps.items()))}; "
            f"agent runs {len(self.runs)}"
        )


def spawn(cmd: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=log, cwd=ROOT)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_soak(seconds: float, workdir: Path | None = None, seed: int = 1) -> Verdict:
    """Run the soak for ``seconds`` of chaos (plus start, drain and stop) and return the verdict."""
    own = workdir is None
    path = Path(tempfile_dir()) if workdir is None else workdir
    soak = Soak(seconds, path, seed)
    verdict = trio.run(soak.main)
    if own and verdict.passed:
        shutil.rmtree(path, ignore_errors=True)
    return verdict


def tempfile_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="nvdaemon-soak-")
