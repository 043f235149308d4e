"""A damaged spool (truncated, garbage, "malformed"): moved aside like engine.json (every copy kept), delivery goes
on with a fresh spool, the quarantine and the events it held (or "unknown") are counted and logged, the task never
crash-loops; ``nvdaemon spool list|retry`` on it exit 2 with one line, no traceback."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from nvdaemon import cli
from nvdaemon.sinks.webhook.spool import FILE, SpoolDB

from .helpers import Faults, Script, event, hook, malformed, running, until
from .storage import tmpfs
from .test_webhook_policy import URL, exposition

NAME = "webhook:test"


def spool_with_pending(path: Path, n: int, endpoint: str = NAME) -> list[str]:
    db = SpoolDB(path)
    ids = [event(i).id for i in range(100, 100 + n)]
    db.add(endpoint, [(i, 1, os.urandom(300)) for i in ids], 10**6, 10**9)
    db.close()
    return ids


def truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def garbage(path: Path) -> None:
    path.write_bytes(os.urandom(8192))


def pages_garbage(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:4096] + os.urandom(len(data) - 4096))  # a valid header, nothing behind it


def quarantined(state_dir: Path) -> list[str]:
    return sorted(p.name for p in state_dir.iterdir() if ".corrupt-" in p.name)


@pytest.mark.parametrize("damage", [truncate, garbage, pages_garbage])
async def test_a_damaged_spool_at_start_is_moved_aside_and_delivery_resumes(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    damage: Callable[[Path], None],
) -> None:
    spool_with_pending(tmp_path / FILE, 40)
    damage(tmp_path / FILE)
    original = (tmp_path / FILE).read_bytes()
    script = Script(lambda seq, n: httpx.Response(200))
    async with running(tmp_path, hook(URL), transport=script.transport()) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: script.delivered == [1])
        assert sink.quarantined == {"unknown": 1}  # the damaged file could not be read, nor counted before
        (record,) = sink.state()["quarantines"]
        assert record["events"] == "unknown" and ".corrupt-" in record["file"]
        assert sink.state()["state"] == "active" and sink.dropped == {}
        text = exposition(sink)
    assert 'nodevitals_webhook_spool_quarantines_total{held="unknown",sink="webhook:test"} 1.0' in text
    moved = quarantined(tmp_path)
    assert moved and (tmp_path / moved[0]).read_bytes() == original  # kept as it was, for a post-mortem
    assert SpoolDB(tmp_path / FILE).rows() == []  # the fresh spool, with event 1 delivered
    assert any("was damaged" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


async def test_damage_found_while_running_counts_what_each_endpoint_held(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    faults = Faults()
    up = [False]
    script = Script(lambda seq, n: httpx.Response(200 if up[0] else 503))
    transport = script.transport()
    async with (
        running(tmp_path, hook(URL), name="webhook:a", transport=transport, opener=faults.opener) as (a, bus_a),
        running(tmp_path, hook(URL), name="webhook:b", transport=transport, opener=faults.opener) as (b, bus_b),
    ):
        for i in range(1, 4):
            bus_a.publish(event(i))
            bus_b.publish(event(i))
        await until(lambda: a.backlog == 3 and b.backlog == 3, timeout=100)
        faults.once = malformed()  # the next write, whichever endpoint makes it, finds the file damaged
        bus_a.publish(event(4))
        await until(lambda: a.dropped.get("spool_corrupt") == 3 and b.dropped.get("spool_corrupt") == 3, timeout=100)
        assert a.quarantined == b.quarantined == {"counted": 1}
        assert a._spool is not None and [q.held for q in a._spool.quarantines] == [{}]  # ids not kept once counted
        assert a.state()["quarantines"][0]["events"] == 3
        up[0] = True
        bus_b.publish(event(5))
        await until(lambda: sorted(script.delivered) == [4, 5], timeout=100)  # on the fresh spool
        assert a.backlog == 0 and b.backlog == 0
    dropped = {i for r in caplog.records if (d := getattr(r, "dropped", None)) for i in d["ids"]}
    assert dropped == {event(i).id for i in (1, 2, 3)}  # both endpoints' copies, logged by id
    assert len([n for n in quarantined(tmp_path) if n.endswith(tuple("0123456789"))]) == 1  # one file moved


@pytest.mark.parametrize("command", [["list"], ["retry"], ["retry", "some-id"]])
def test_spool_cli_on_a_damaged_spool_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"stateDir: {tmp_path}\n")
    (tmp_path / FILE).write_bytes(b"this is not sqlite\n" * 300)
    assert cli.main(["spool", *command, "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "is damaged (file is not a database)" in err


def test_spool_cli_on_an_unreadable_spool_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"stateDir: {tmp_path}\n")
    (tmp_path / FILE).mkdir()  # not a file at all: sqlite cannot open it
    assert cli.main(["spool", "list", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot be read or written" in err


async def test_a_damaged_spool_on_a_read_only_state_dir_is_reported_not_a_crash(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script(lambda seq, n: httpx.Response(200))
    with tmpfs(tmp_path / "state", "256k") as state:
        (state / FILE).write_bytes(b"garbage" * 1000)
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        async with running(state, hook(URL), transport=script.transport()) as (sink, bus):
            bus.publish(event(1))
            await until(lambda: sink.health.error is not None, timeout=100)
            await trio.sleep(60)
            assert "cannot move it aside" in (sink.health.error or "")
            assert sink.state()["state"] == "degraded" and sink.committed_seq == 0 and sink.quarantined == {}
        assert (state / FILE).exists() and script.delivered == []


async def test_an_event_delivered_as_its_spool_is_found_damaged_is_delivered_not_also_dropped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The receiver acks event 1, and deleting it finds the file damaged: the moved copy still lists it as pending,
    but it was delivered. emitted = delivered + dropped, each event in exactly one."""
    faults = Faults()

    def answer(seq: int, n: int) -> httpx.Response:
        if seq == 1:
            faults.once = malformed()  # the delete that follows this 200
        return httpx.Response(200)

    script = Script(answer)
    async with running(tmp_path, hook(URL), transport=script.transport(), opener=faults.opener) as (sink, bus):
        for i in (1, 2):
            bus.publish(event(i))
        await until(lambda: sink.quarantined == {"counted": 1}, timeout=100)
        bus.publish(event(3))
        await until(lambda: 3 in script.delivered, timeout=100)
    dropped = {i for r in caplog.records if (d := getattr(r, "dropped", None)) for i in d["ids"]}
    delivered = {event(s).id for s in script.delivered}
    assert not dropped & delivered, (sorted(script.delivered), sink.dropped)
    assert dropped | delivered == {event(i).id for i in (1, 2, 3)}
    assert sum(sink.dropped.values()) == len(dropped)


async def test_an_event_whose_spool_is_replaced_while_its_request_fails_is_dropped_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Endpoint a's request for event 1 is out (it will time out) when endpoint b's write finds the file damaged:
    a's event 1 is gone with the moved file and counted once, as a drop."""
    faults = Faults()
    script_a = Script(lambda seq, n: None if seq == 1 and n == 1 else httpx.Response(200))
    script_b = Script(lambda seq, n: httpx.Response(200))
    async with (
        running(
            tmp_path,
            hook(URL, timeoutSeconds=5),
            name="webhook:a",
            transport=script_a.transport(),
            opener=faults.opener,
        ) as (a, bus_a),
        running(tmp_path, hook(URL), name="webhook:b", transport=script_b.transport(), opener=faults.opener) as (
            _,
            bus_b,
        ),
    ):
        bus_a.publish(event(1))
        await until(lambda: len(script_a.calls) == 1)
        faults.once = malformed()
        bus_b.publish(event(2))  # b's write finds the file damaged while a's request is out
        await until(lambda: a.quarantined == {"counted": 1} and script_b.delivered == [2], timeout=100)
        await until(lambda: sum(a.dropped.values()) >= 1, timeout=100)
        bus_a.publish(event(3))
        await until(lambda: script_a.delivered == [3], timeout=100)
    assert a.dropped == {"spool_corrupt": 1} and script_a.delivered == [3]
    dropped_a = [
        i for r in caplog.records if (d := getattr(r, "dropped", None)) and d["sink"] == "webhook:a" for i in d["ids"]
    ]
    assert dropped_a == [event(1).id]
