"""A webhook event's age (``maxAgeHours``, the delivery latency, ``nvdaemon spool list``) is measured on a clock that
cannot step: a wall-clock step of days (an NTP correction of a bad RTC, ``date -s``) neither expires a backlog that is
seconds old nor keeps a really old event alive; only an event spooled before a reboot is aged on the wall clock, and
never to less than zero.

The sender runs on the virtual clock (``autojump_clock``) with a wall clock that steps on demand; where a test does
not inject the steady clock the sink uses the real one (``CLOCK_BOOTTIME``), which hardly moves while it runs. The
end-to-end test runs the real agent under libfaketime against a real loopback receiver."""

from __future__ import annotations

import glob
import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio.testing

from nvdaemon import cli
from nvdaemon.sinks.webhook.spool import DEAD, FILE, PENDING, SpoolDB

from ..test_e2e import ROOT, Agent, free_port, wait_for
from .helpers import SECRET, Script, event, hook, running, until

URL = "https://receiver.example:8443/hooks/hw"
T0 = 1_700_000_000.0
STEP = 4 * 86400.0  # the step the issue reproduced with: four days


class Wall:
    """A wall clock on the virtual one that steps when told to."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return T0 + self.offset + trio.current_time()


async def test_a_forward_wall_clock_step_expires_nothing_in_a_backlog(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wall = Wall()
    failing = [True]
    script = Script(lambda seq, n: httpx.Response(503 if failing[0] else 200))
    h = hook(URL, maxAgeHours=1, backoffBaseSeconds=1, backoffMaxSeconds=5)
    async with running(tmp_path, h, transport=script.transport(), wall=wall) as (sink, bus):
        for i in range(1, 6):
            bus.publish(event(i))
        await until(lambda: len(script.times(1)) >= 2 and sink.backlog == 5, timeout=100)
        wall.offset = STEP
        tried = len(script.calls)
        await until(lambda: len(script.calls) >= tried + 3 or sink.dropped, timeout=100)
        expired = sink.dropped.get("expired")
        assert sink.dropped == {}, f"{expired} of 5 pending events, seconds old, expired after a 4-day step"
        assert (sink.backlog, sink.dead_letters) == (5, 0)
    # The age survives a restart on the same spool (same boot): still nothing expires, and once the receiver is
    # back each event's latency is its few seconds in the spool, not four days.
    async with running(tmp_path, h, transport=script.transport(), wall=wall) as (sink, _bus):
        tried = len(script.calls)
        await until(lambda: len(script.calls) >= tried + 2 or sink.dropped, timeout=100)
        assert sink.dropped == {}
        failing[0] = False
        await until(lambda: script.delivered == [1, 2, 3, 4, 5], timeout=100)
        assert sink.latency.count == 5 and sink.latency.total < 5 * 3600, sink.latency
    assert SpoolDB(tmp_path / FILE).rows() == []


@pytest.mark.parametrize("step", [STEP, -STEP], ids=["forward", "backward"])
async def test_an_event_expires_when_the_steady_clock_says_whatever_the_wall_clock_does(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, step: float
) -> None:
    from nvdaemon.sinks.spool_clock import SteadyClock  # (imported here: the test above runs without it)

    wall = Wall()
    steady = SteadyClock("boot-a", trio.current_time)
    script = Script(lambda seq, n: httpx.Response(503))
    h = hook(URL, maxAgeHours=0.01, backoffBaseSeconds=1, backoffMaxSeconds=5)  # 36 s
    async with running(tmp_path, h, transport=script.transport(), wall=wall, clock=steady) as (sink, bus):
        for i in range(1, 4):
            bus.publish(event(i))
        await until(lambda: len(script.times(1)) >= 2, timeout=100)
        wall.offset = step
        await until(lambda: sink.dropped.get("expired") == 3, timeout=100)
        expired_at = trio.current_time()
    assert 36 <= expired_at <= 36 + 5 + 1  # at the first look after 36 s of age (backoff at most 5 s)
    assert max(script.times(1)) < 36  # never sent once older than maxAgeHours
    assert {r.dead_reason for r in SpoolDB(tmp_path / FILE).rows(DEAD)} == {"expired"}


async def test_an_event_spooled_before_a_reboot_is_aged_on_the_wall_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from nvdaemon.sinks.spool_clock import SteadyClock

    body = msgspec.json.encode(event(1))
    db = SpoolDB(tmp_path / FILE)
    db.add("webhook:test", [(event(1).id, 1, body)], 100, 1 << 20, T0 - 2 * 3600, ("boot-before", 10.0))
    db.close()
    script = Script(lambda seq, n: httpx.Response(503))
    after_reboot = SteadyClock("boot-now", trio.current_time)  # boottime restarted: 10.0 means nothing now
    h = hook(URL, maxAgeHours=1)
    async with running(tmp_path, h, transport=script.transport(), wall=Wall(), clock=after_reboot) as (sink, _bus):
        await until(lambda: sink.dropped, timeout=100)
        assert sink.dropped == {"expired": 1} and script.calls == []


def test_ages_within_a_boot_across_a_reboot_and_after_spool_retry(tmp_path: Path) -> None:
    from nvdaemon.sinks.spool_clock import SteadyClock

    db = SpoolDB(tmp_path / FILE)
    db.add("a", [("e1", 1, b"{}")], 100, 1 << 20, 1000.0, ("boot-a", 50.0))
    (row,) = db.rows()
    same_boot = SteadyClock("boot-a", lambda: 80.0)
    assert (row.boot_id, row.boottime) == ("boot-a", 50.0)
    assert row.age(same_boot, 1000.0 + STEP) == 30.0  # the wall clock stepped forward: not counted
    assert row.age(same_boot, 1000.0 - STEP) == 30.0  # nor backward
    rebooted = SteadyClock("boot-b", lambda: 5.0)
    assert row.age(rebooted, 1000.0 + 7200) == 7200.0  # another boot: the wall clock is all there is
    assert row.age(rebooted, 1000.0 - STEP) == 0.0  # never negative
    # ``nvdaemon spool retry`` gives a fresh age on both clocks.
    db.bury("a", row.seq, "e1", 3, "expired", "HTTP 503")
    assert db.retry(now=2000.0, stamp=("boot-b", 7.0)) == 1
    (row,) = db.rows(PENDING)
    assert (row.enqueued, row.boot_id, row.boottime) == (2000.0, "boot-b", 7.0)
    db.close()


def test_the_system_clock_is_boottime_of_this_boot() -> None:
    from nvdaemon.sinks.spool_clock import BOOT_ID, system_clock

    clock = system_clock()
    try:
        boot_id = BOOT_ID.read_text().strip()
    except OSError as exc:
        pytest.skip(f"no boot id here ({exc.strerror}): the clock is trusted within one process only")
    assert clock.boot_id == boot_id
    # CLOCK_BOOTTIME itself: bracketed by two readings of it (a wall or monotonic clock would fall outside).
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    a = clock.now()
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    assert before <= a <= after


def test_spool_list_shows_the_age_the_expiry_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An event whose wall-clock enqueue time is 4 days before now (the clock stepped forward since it was spooled)
    is listed as seconds old: the age the sender expires it by."""
    config = tmp_path / "c.yaml"
    config.write_text(f"stateDir: {tmp_path}\n")
    db = SpoolDB(tmp_path / FILE)
    db.add("webhook:a.example", [("e1", 1, msgspec.json.encode(event(1)))], 10, 10**6, time.time() - STEP)
    db.close()
    assert cli.main(["spool", "list", "--config", str(config)]) == 0
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("e1 ")]
    age = int(line.split()[5].rstrip("s"))
    assert age < 3600, line


# ---- end to end: the real agent under libfaketime, a real receiver on loopback ---------------------------------

CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.3
stateDir: {state}
shutdownGraceSeconds: {grace}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
  webhook:
    - url: {url}
      secret: ${{E2E_WEBHOOK_SECRET}}
      maxAgeHours: 1
      backoffBaseSeconds: 0.1
      backoffMaxSeconds: 0.3
rules:
  - {{metric: load1, device: cpu, condition: load_high, threshold: 16}}
  - {{metric: load5, device: cpu, condition: load5_high, threshold: 16}}
  - {{metric: load15, device: cpu, condition: load15_high, threshold: 5}}
"""  # the fixture host's loadavg (24.51 18.32 9.87) enters all three: a backlog of 3


# What is checked is expiry across the step, not how fast the agent stops: on a loaded CI runner (make test-busy) a
# spool write still in its worker thread at SIGTERM once took the agent past a 5 s grace (exit code 1 from the
# shutdown guard, as designed).
GRACE = 20.0


def libfaketime() -> str | None:
    """The preload library of Debian's ``libfaketime`` package (or a local build), or None."""
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                    "/usr/local/lib/faketime/libfaketime.so.1"):  # fmt: skip
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def sink_state(agent: Agent, sink: str) -> dict[str, Any]:
    """The sink's part of ``/v1/status``; empty while the agent does not answer (a busy moment)."""
    status, body = agent.get("/v1/status")
    return dict(json.loads(body)["sinks"].get(sink, {})) if status == 200 else {}


@pytest.mark.e2e
def test_the_agent_expires_nothing_when_the_wall_clock_jumps_four_days(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from .receiver import Receiver

    lib = libfaketime()
    if lib is None:
        pytest.skip("libfaketime is not installed (Debian package libfaketime): the real clock step is not tried")
    # The step is what libfaketime reads from this file on every call (FAKETIME_NO_CACHE); only the wall clock
    # steps (FAKETIME_DONT_FAKE_MONOTONIC: CLOCK_MONOTONIC and CLOCK_BOOTTIME are left alone, as a real step does).
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    monkeypatch.setenv("E2E_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("LD_PRELOAD", lib)  # for the agent only: this process is already running
    monkeypatch.setenv("FAKETIME_TIMESTAMP_FILE", str(offset))
    monkeypatch.setenv("FAKETIME_NO_CACHE", "1")
    monkeypatch.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    # No signature check at this receiver: the signatures' timestamps are wall-clock by the Standard Webhooks
    # specification, so one with a good clock would refuse them four days off (401), which is not what is tested.
    with Receiver() as rx:
        rx.default = 503
        config = tmp_path / "config.yaml"
        config.write_text(CONFIG.format(state=state, port=free_port(), url=rx.url, grace=GRACE))
        agent, sink = Agent(tmp_path, host, config), f"webhook:127.0.0.1:{rx.port}"
        try:
            agent.start()
            wait_for(lambda: sink_state(agent, sink).get("backlog", 0) >= 3, "a backlog of 3 events")
            offset.write_text("+4d\n")
            seen = len(rx.received)
            # The agent saw the step: a later attempt is signed with a webhook-timestamp days ahead of this clock.
            stepped = time.time() + 3 * 86400
            wait_for(
                lambda: any(int(r.headers.get("webhook-timestamp", "0")) > stepped for r in rx.received[seen:]),
                "an attempt signed after the 4-day step",
            )
            seen = len(rx.received)
            wait_for(
                lambda: len(rx.received) >= seen + 5 or sink_state(agent, sink).get("deadLetters"),
                "5 more attempts after the step, or dead letters",
            )
            s = agent.status()["sinks"][sink]
            assert (s["deadLetters"], s["dropped"]) == (0, {}), (
                f"{s['deadLetters']} of {s['deadLetters'] + s['backlog']} pending events expired after a 4-day step"
            )
            rx.default = 200
            emitted = {e["id"] for e in agent.status()["recentEvents"]}
            wait_for(lambda: emitted <= set(rx.ids()), "every event delivered once the receiver is back", timeout=30)
            code, _ = agent.stop(GRACE)
            assert code == 0, agent.diagnosis()
        finally:
            agent.kill()
