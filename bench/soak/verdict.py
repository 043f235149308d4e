"""The soak's records and its verdict: what happened to each agent process, the events its log lists, and the
checks (numbered as in the docstring of ``bench.soak``) that turn them into PASS or FAIL."""

from __future__ import annotations

import collections
import itertools
import json
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak.clients import READ_BY_SECONDS, Reader, StallEpisode
from bench.soak.receiver import FlappingReceiver, Receipt
from tests.nvsentinel.connector import FakeConnector

STORM_SETTLE_SECONDS = 5.0  # after the reload storm, before the resource check's samples begin
RSS_TOLERANCE_KIB = 8 * 1024  # RSS may grow by at most this much after the warm-up, per agent process
FD_TOLERANCE = 10  # open file descriptors likewise


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
    reloads_while_full: int = 0  # SIGHUPs sent while the stateDir was full: a reload that retires a rule is refused
    reloads: dict[str, int] = field(default_factory=dict)  # the agent's own count, read at the end of the run
    storm_reloads: int = 0  # reloads the agent counted during the reload storm (its SIGHUPs coalesce)
    storm_end: float | None = None  # seconds since start when the reload storm ended, if this run had it


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


@dataclass
class Kill:
    """What the SIGKILL half-way left behind."""

    at: float | None = None  # time.monotonic() of the SIGKILL
    seq: int = 0  # engine.json seq after the SIGKILL
    emitted: int | None = None  # the engine's seq shortly before the SIGKILL
    spooled: set[str] = field(default_factory=set)  # event ids in the spool after the SIGKILL


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


def check_name(condition: str) -> str:
    return "Nvdaemon" + "".join(part.capitalize() for part in condition.split("_"))


# ---- the checks ----------------------------------------------------------------------------------------------
def must_deliver(logged: list[LoggedEvent], runs: int, kill: Kill) -> set[str]:
    """The ids of the events that must reach the receiver (see the docstring of ``bench.soak``): every event of
    the last run, and those of earlier runs that the state saved or the spool held at the kill."""
    last = runs
    return {e.id for e in logged if e.run == last or (e.run < last and (e.seq <= kill.seq or e.id in kill.spooled))}


def check_delivery(
    logged: list[LoggedEvent],
    must: set[str],
    receipts: list[Receipt],
    receiver: FlappingReceiver,
    kill: Kill,
    drained: bool,
    drain_seconds: float,
) -> Check:
    """1. Every durable event acked; a duplicate only across the kill, or after an ack the sender may not have read
    (the receiver cut the connection, or the sender closed it right after: a request cancelled by a replacement)."""
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
            if kill.at is not None and prev.at < kill.at < again.at:
                across += 1
            elif receiver.unconfirmed(prev):
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
        f"duplicates: {across} across the kill, {after_cut} after a cut or an unread ack, {unexplained} unexplained; "
        f"requests {dict(sorted(answered.items()))}; SIGKILL at seq ~{kill.emitted} with state saved up to "
        f"seq {kill.seq} and {len(kill.spooled)} events in the spool; drained: {drained} "
        f"({drain_seconds:.0f} s)",
    )


def check_receiver_view(receipts: list[Receipt], final: dict[str, Any]) -> Check:
    """2. The receiver's view (the last phase per condition and device) equals the engine's active conditions."""
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


def connector_diff(connector: FakeConnector, state: dict[str, Any]) -> list[str]:
    """How the connector's True node conditions differ from the critical conditions of the agent's state."""
    expected: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter(
        (check_name(c["condition"]), (c["condition"],)) for c in state["conditions"] if c["severity"] == "critical"
    )
    actual: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter()
    with connector.lock:
        for cond in connector.conditions.values():
            if cond.status == "True":
                for _, codes in cond.entries:
                    actual[(cond.type, codes)] += 1
    return [f"{k[0]} x{n}" for k, n in (expected - actual).items()] + [
        f"extra {k[0]} x{n}" for k, n in (actual - expected).items()
    ]


def check_connector(connector: FakeConnector, final: dict[str, Any]) -> Check:
    """3. The platform-connector's node conditions equal the engine's active critical conditions."""
    diff = connector_diff(connector, final) if final else ["no final state"]
    nv = final.get("sinks", {}).get("nvsentinel", {})
    true = sorted(c.type for c in connector.conditions.values() if c.status == "True")
    calls = collections.Counter(r.code for r in connector.calls())
    return Check(
        "platform-connector conditions = engine critical conditions",
        not diff and nv.get("pending") == 0,
        f"True conditions {true}; differences {diff}; agent pending {nv.get('pending')}; "
        f"calls {dict(sorted(calls.items()))}",
    )


def check_stream(readers: list[Reader], episodes: list[StallEpisode], logged: list[LoggedEvent]) -> Check:
    """4. The readers saw every event of a run in order, across their resumes; the never-reading clients were cut."""
    where = {e.id: (e.run, e.position) for e in logged}
    problems: list[str] = []
    figures: list[str] = []
    gap_examples: list[str] = []
    for reader in readers:
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
                    if len(gap_examples) < 5:
                        gap_examples.append(f"{reader.name} run {at[0]} #{prev[1]} -> #{at[1]}")
            prev, prev_conn = at, conn
        slow = reader.close_codes.count(1013)
        figures.append(
            f"{reader.name}: {len(reader.received)} events over {reader.connections} connections "
            f"({slow} closed 1013), {gaps} gaps, {disorder} repeated or out of order, {unknown} unknown"
        )
        if unknown or gaps or disorder or not reader.received:
            problems.append(reader.name)
    done = [e for e in episodes if not e.agent_restarted]
    kicked = [e for e in done if e.kicked]
    endings = collections.Counter(e.ending for e in kicked)
    figures.append(
        f"never-reading clients: {len(done)} (+{len(episodes) - len(done)} ended by the SIGKILL), cut as "
        f"slow {len(kicked)} (what they read at the end: {dict(endings)}; began to read within "
        f"{READ_BY_SECONDS:g} s of the cut {sum(e.prompt for e in kicked)}, latest "
        f"{max((e.read_after for e in kicked), default=0):.1f} s), dropped otherwise (TCP_USER_TIMEOUT) "
        f"{sum(e.dropped and not e.kicked for e in done)}, never dropped {sum(not e.dropped for e in done)}"
    )
    no_frame = [e for e in kicked if e.prompt and e.ending != "close:1013"]
    if no_frame:
        figures.append(
            "without the close frame: "
            + "; ".join(f"{e.ending} after reading from {e.read_after:.1f} s: {e.frames}" for e in no_frame)
        )
    if not kicked or no_frame or not all(e.dropped for e in done):
        problems.append("never-reading clients")
    if gap_examples:
        figures.append(f"gaps: {', '.join(gap_examples)}")
    return Check("stream clients", not problems, "; ".join(figures))


def check_reloads(runs: list[Run], timeouts: int) -> Check:
    """5. Every SIGHUP answered; applied, or rejected only while the stateDir was full (a reload that retires a rule
    must first write engine state there, and refusing it keeps the running config: issue-15 semantics)."""
    parts = []
    ok = timeouts == 0
    for run in runs:
        got = run.reloads.get("ok", -1)
        rejected = run.reloads.get("rejected", -1)
        expected = run.reloads_sent + run.storm_reloads
        ok = ok and got + rejected == expected and 0 <= rejected <= run.reloads_while_full
        storm = f" + {run.storm_reloads} reloads of the storm" if run.storm_reloads else ""
        parts.append(
            f"run {run.index}: {run.reloads_sent} SIGHUPs ({run.reloads_while_full} while the stateDir was full)"
            f"{storm}, {got} applied, {rejected} rejected"
        )
    return Check("SIGHUP reloads", ok, "; ".join(parts) + f"; timeouts {timeouts}")


def check_tasks(before: dict[str, Any], final: dict[str, Any], health: int | None) -> Check:
    """6. Every task running at the end, none restarted while the agent settled, ``/healthz`` 200."""
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


def check_resources(runs: list[Run], warmup: float) -> list[Check]:
    """7. RSS and open fds did not grow after the warm-up, per agent process. A run with the reload storm is measured
    from the storm's end (a burst of replaced endpoints settles the allocator at a new level once; the storm's own
    check reports RSS before and after it)."""
    checks = []
    for run in runs:
        start = warmup if run.storm_end is None else max(warmup, run.storm_end + STORM_SETTLE_SECONDS)
        measured = [s for s in run.samples if s[0] >= start]
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
                f"after {warmup:g} s warm-up{'' if run.storm_end is None else ' and the reload storm'}, over "
                f"{span:.0f} s ({len(measured)} samples): RSS "
                f"{rss0 / 1024:.1f} -> {rss1 / 1024:.1f} MiB (max {rss_max / 1024:.1f}, tolerance "
                f"+{RSS_TOLERANCE_KIB / 1024:g}), fds {fd0:g} -> {fd1:g} (max {fd_max}, tolerance +{FD_TOLERANCE})",
            )
        )
    return checks


# ---- a full stateDir, and the exact count of every event ---------------------------------------------------------
@dataclass
class FullPhase:
    """What the phase that filled the stateDir saw (``skipped`` says why it did not run)."""

    skipped: str | None = None
    seconds: float = 0.0
    ballast: int = 0  # bytes written until the filesystem was full
    degraded: bool = False  # the webhook endpoint showed state degraded, stateWritable false
    metric_zero: bool = False  # nodevitals_sink_state_writable was 0
    unspooled_max: int = 0  # most events held in memory at once


def parse_drops(path: Path) -> dict[str, str]:
    """Event id -> reason for every drop a run logged (the webhook logs each with its ids)."""
    drops: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(doc, dict) and isinstance(d := doc.get("dropped"), dict):
            for event_id in d.get("ids", []):
                drops[str(event_id)] = str(d.get("reason"))
    return drops


def check_full_state_dir(phase: FullPhase, final: dict[str, Any]) -> Check:
    """The stateDir filled to the last byte, then freed: the endpoint showed it, and recovered."""
    if phase.skipped:
        return Check("stateDir full, then freed", True, f"phase skipped: {phase.skipped}")
    hook: dict[str, Any] = next((v for k, v in final.get("sinks", {}).items() if k.startswith("webhook:")), {})
    recovered = hook.get("stateWritable") is True and hook.get("unspooled") == 0
    return Check(
        "stateDir full, then freed",
        phase.degraded and phase.metric_zero and recovered,
        f"{phase.ballast / 1048576:.1f} MiB of ballast for {phase.seconds:.0f} s: endpoint degraded {phase.degraded}, "
        f"nodevitals_sink_state_writable 0 {phase.metric_zero}, up to {phase.unspooled_max} events held in memory; "
        f"at the end writable {hook.get('stateWritable')} with {hook.get('unspooled')} unspooled",
    )


def check_accounting(
    logged: list[LoggedEvent],
    receipts: list[Receipt],
    drops: dict[int, dict[str, str]],
    must: set[str],
    final: dict[str, Any],
) -> Check:
    """Emitted = delivered + counted drops (+ those lost with the kill, which the saved state never passed), exactly:
    every emitted event is in exactly one of them (none both delivered and counted as dropped), and the last run's
    drop counters equal the drops it logged by id."""
    every = {i: why for run in drops.values() for i, why in run.items()}
    emitted = {e.id for e in logged}
    delivered = {r.event_id for r in receipts if r.answered == "200" and r.event_id} & emitted
    both = set(every) & delivered  # counted as dropped, yet acked: the drop counters overstate the loss
    dropped = set(every) & emitted - delivered
    lost = emitted - must - delivered - dropped
    unexplained = emitted - delivered - dropped - lost
    hook: dict[str, Any] = next((v for k, v in final.get("sinks", {}).items() if k.startswith("webhook:")), {})
    counters = {k: v for k, v in hook.get("dropped", {}).items() if v}
    logged_last = dict(collections.Counter(drops.get(max(drops, default=0), {}).values()))
    ok = not unexplained and not both and counters == logged_last
    return Check(
        "emitted = delivered + counted drops",
        ok,
        f"{len(emitted)} emitted = {len(delivered)} delivered + {len(dropped)} dropped and counted "
        f"{dict(sorted(collections.Counter(every[i] for i in dropped).items()))} + {len(lost)} lost with the kill "
        f"(after the last state save, never spooled: detected again); {len(unexplained)} unexplained; {len(both)} "
        f"both delivered and counted as dropped; last run: "
        f"drop counters {counters}, drops logged by id {logged_last}",
    )
