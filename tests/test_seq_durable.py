"""Event seqs are never issued twice, whatever happened to stateDir: they come from a durable mark that only moves
forward (``stateDir/seqmark.json``), not from ``engine.json``, which may lag behind the seqs issued.

The agent's own start, rule engine, engine-state saves and stop run in this process; the events are read from its
event log (what an operator and every live consumer saw). A real read-only stateDir needs root: a tmpfs remounted
read-only mid-run, and an ext4 image that a filesystem error turns read-only (``errors=remount-ro``, with the
webhook spool open on it); elsewhere those tests skip and say why. The same issue without mounts: the engine-state
write refused, and the mark's own writes refused by a stateDir path that turned into a file.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

import nvdaemon.app
import nvdaemon.engine_store
from nvdaemon import engine
from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.engine import EngineState
from nvdaemon.model import Sample, TierSnapshot
from nvdaemon.server.state import status_document
from tests.sinks.storage import tmpfs
from tests.test_e2e import free_port

CONFIG = """
node: n1
tiers: []
stateDir: {state}
shutdownGraceSeconds: 5
kernelLog: {{enabled: false}}  # the host's kernel log would add events (and these tests make the kernel log some)
sinks:
  stream: {{enabled: false}}
  metrics: {{listenAddr: '127.0.0.1:0'}}
{webhook}
rules:
  - {{metric: seq_probe, device: probe, condition: probe_high, threshold: 8}}
"""
# An endpoint nothing listens on: its events wait in the spool, which holds engine.json back while it refuses writes.
WEBHOOK = "  webhook:\n    - {{url: 'http://127.0.0.1:{port}/hook', secret: s3cret, backoffBaseSeconds: 0.05}}"


@contextlib.asynccontextmanager
async def running(state: Path, webhook: str = "") -> AsyncIterator[Agent]:
    """``Agent.run`` on ``state`` until the block ends, then its stop (what SIGTERM does)."""
    agent = Agent(parse_config(CONFIG.format(state=state, webhook=webhook), "seq.yaml", env={}))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        await agent.started.wait()
        yield agent
        agent.stopping.set()


async def transitions(agent: Agent, n: int) -> None:
    """``n`` transitions of probe_high (ENTER, EXIT, ENTER, ...) through the rule engine, each followed by the engine
    state save a tier tick makes."""
    for _ in range(n):
        value = 1.0 if agent.engine.active else 20.0
        agent.on_snapshot(TierSnapshot("core", (Sample("seq_probe", "probe", value),), {}, time.time(), 0.0))
        await agent.persist_engine()


def issued(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.event["seq"] for r in caplog.records if r.name == "nvdaemon.events"]  # type: ignore[attr-defined]


def saved_seq(state: Path) -> int:
    return engine.load_state((state / nvdaemon.engine_store.ENGINE_FILE).read_bytes()).seq


def assert_each_seq_once(seqs: list[int]) -> None:
    repeated = sorted({s for s in seqs if seqs.count(s) > 1})
    assert repeated == [], f"seqs issued twice: {repeated} (in order: {seqs})"
    assert seqs == sorted(seqs)


def refuse(path: Path, data: bytes) -> None:
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


# ---- the agent --------------------------------------------------------------------------------------------------
async def test_a_restart_after_refused_engine_state_writes_issues_no_seq_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
) -> None:
    caplog.set_level(logging.INFO, "nvdaemon.events")
    state = tmp_path / "state"
    async with running(state) as agent:
        await transitions(agent, 2)
        assert saved_seq(state) == 2
        monkeypatch.setattr(nvdaemon.app, "atomic_write", refuse)  # engine.json is refused from here
        await transitions(agent, 6)
        assert agent.engine.seq == 8 and agent.engine_save_error is not None
    assert saved_seq(state) == 2  # engine.json lags six seqs behind those issued
    monkeypatch.undo()
    async with running(state) as agent:
        await transitions(agent, 2)
        doc = status_document(agent)
    seqs = issued(caplog)
    assert len(seqs) == 10
    assert_each_seq_once(seqs)
    assert doc["eventSeqUnreserved"] == 0 and doc["eventSeqReserved"] >= doc["eventSeq"] + 512  # half a block


def run_or_skip(cmd: list[str], why: str) -> None:
    """Outside the agent's nursery only: a skip raised inside it would lose its reason to the exception group."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"{why}: {proc.stderr.strip() or proc.returncode}")


def remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], capture_output=True, check=True)


async def test_tmpfs_state_dir_remounted_read_only_mid_run_then_restarted_issues_no_seq_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    """stateDir's filesystem is remounted read-only mid-run; the engine state of the six events issued then is never
    saved; after the filesystem is writable again and a restart, the next events reuse none of their seqs. (No
    webhook here: its open spool would keep the remount from happening, see the ext4 case.)"""
    caplog.set_level(logging.INFO, "nvdaemon.events")
    with tmpfs(tmp_path / "state", "4m") as state:
        run_or_skip(["mount", "-o", "remount,ro", str(state)], "cannot remount a tmpfs read-only here")
        remount(state, "rw")
        async with running(state) as agent:
            await transitions(agent, 2)
            assert saved_seq(state) == 2
            remount(state, "ro")
            try:
                await transitions(agent, 6)
                assert agent.engine.seq == 8 and agent.engine_save_error is not None
            finally:
                agent.stopping.set()  # the stop too runs while stateDir is read-only
        remount(state, "rw")
        assert saved_seq(state) == 2
        async with running(state) as agent:
            await transitions(agent, 2)
    seqs = issued(caplog)
    assert len(seqs) == 10
    assert_each_seq_once(seqs)


@contextlib.contextmanager
def ext4(image: Path, path: Path) -> Iterator[Path]:
    """A 16 MiB ext4 on a loop device at ``path`` that remounts itself read-only on a filesystem error (what a
    real node's stateDir does); skips where that cannot be had."""
    if os.geteuid() != 0:
        pytest.skip("mounting an ext4 image needs root (the emergency read-only stateDir case)")
    run_or_skip(["truncate", "-s", "16M", str(image)], "cannot make an image file")
    run_or_skip(["mkfs.ext4", "-q", "-F", str(image)], "cannot make an ext4 filesystem")
    path.mkdir(parents=True, exist_ok=True)
    run_or_skip(["mount", "-o", "loop,errors=remount-ro", str(image), str(path)], "cannot mount an ext4 loop image")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def error_trigger(path: Path) -> Path:
    """ext4's debug trigger for the filesystem at ``path``: written to, the filesystem meets an error, aborts its
    journal and turns read-only at once, with files open for writing (the spool) and all."""
    device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(path)], capture_output=True, text=True, check=False)
    trigger = Path("/sys/fs/ext4") / Path(device.stdout.strip()).name / "trigger_fs_error"
    if not trigger.exists():
        pytest.skip(f"this kernel has no {trigger.name} for ext4 (the emergency read-only stateDir case)")
    return trigger


def fsck(image: Path, path: Path) -> None:
    """Unmount, repair, mount again: what an operator does before the restart."""
    subprocess.run(["umount", str(path)], capture_output=True, check=True)
    done = subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: errors corrected
    subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(image), str(path)], capture_output=True, check=True)


async def test_ext4_state_dir_turned_read_only_by_an_error_mid_run_then_restarted_issues_no_seq_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    """The issue's case: a webhook endpoint whose receiver is away, stateDir's ext4 turned read-only by a filesystem
    error mid-run; the events issued then are held in memory and dropped at the stop (counted); after fsck and a
    restart, the next events reuse none of their seqs."""
    caplog.set_level(logging.INFO, "nvdaemon.events")
    webhook = WEBHOOK.format(port=free_port())
    image = tmp_path / "state.img"
    with ext4(image, tmp_path / "state") as state:
        trigger = error_trigger(state)
        async with running(state, webhook) as agent:
            await transitions(agent, 2)
            assert saved_seq(state) == 2
            try:
                trigger.write_text("nvdaemon test: emergency read-only\n")
                await transitions(agent, 6)
                assert agent.engine.seq == 8 and saved_seq(state) == 2
            finally:
                agent.stopping.set()
        fsck(image, state)
        assert saved_seq(state) == 2
        async with running(state, webhook) as agent:
            await transitions(agent, 2)
    dropped = [r for r in caplog.records if getattr(r, "dropped", None)]
    assert dropped, "the events held in memory at the stop were dropped and counted"
    seqs = issued(caplog)
    assert len(seqs) == 10
    assert_each_seq_once(seqs)


# ---- the mark (its module is imported by each test: the agent tests above run, and fail, without it) --------------
async def test_the_mark_stays_half_a_block_ahead_and_covers_every_seq_issued_while_writes_are_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    from nvdaemon.engine import draw_seq
    from nvdaemon.seqmark import BLOCK, MARK_FILE, SeqMark, read_mark

    caplog.set_level(logging.INFO, "nvdaemon.seqmark")
    state_dir = tmp_path / "state"
    path = state_dir / MARK_FILE
    state, mark = EngineState(), SeqMark()
    mark.load(state, path)
    assert await mark.reserve(state, path)
    assert read_mark(path) == state.reserved == BLOCK
    while state.seq < BLOCK // 2:  # half a block left: no write yet
        draw_seq(state)
        await mark.keep_ahead(state, path)
    assert read_mark(path) == BLOCK
    draw_seq(state)
    await mark.keep_ahead(state, path)
    first = BLOCK // 2 + 1 + BLOCK
    assert read_mark(path) == state.reserved == first

    # stateDir stops taking writes (its path is now a file: every write fails, for root too). Events go on.
    state_dir.rename(tmp_path / "kept")
    state_dir.write_bytes(b"")
    for n in range(2 * BLOCK):
        draw_seq(state)
        if n % 10 == 0:  # one tick every 10 events
            await mark.keep_ahead(state, path)
    assert state.reserved == first and state.unreserved == state.seq - first
    messages = [r.getMessage() for r in caplog.records]
    assert sum("event seq mark not saved" in m for m in messages) == 1  # once per streak, not every tick
    assert sum(f"issued past the saved mark {first}" in m for m in messages) == 1

    # A restart before the disk is back ("fsck"): the seq continues from the mark, past every seq issued under it;
    # only the ``unreserved`` ones, counted and logged, could come again.
    state_dir.unlink()
    (tmp_path / "kept").rename(state_dir)
    restarted = EngineState(seq=3)  # engine.json, far behind
    SeqMark().load(restarted, path)
    assert restarted.seq == first and restarted.reserved == first

    # The disk is back in the same run instead: the next tick reserves past the seqs issued meanwhile.
    await mark.keep_ahead(state, path)
    assert read_mark(path) == state.reserved == state.seq + BLOCK
    assert any("event seq mark saved again" in r.getMessage() for r in caplog.records)


async def test_a_stateDir_moved_by_a_reload_gets_a_mark_at_the_next_tick(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    from nvdaemon.engine import draw_seq
    from nvdaemon.seqmark import BLOCK, MARK_FILE, SeqMark, read_mark

    state, mark = EngineState(), SeqMark()
    old, new = tmp_path / "a" / MARK_FILE, tmp_path / "b" / MARK_FILE
    mark.load(state, old)
    await mark.reserve(state, old)
    draw_seq(state)
    await mark.keep_ahead(state, new)
    assert read_mark(new) == 1 + BLOCK and read_mark(old) == BLOCK


def test_a_damaged_mark_is_moved_aside_and_the_seq_continues_from_engine_json(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from nvdaemon.seqmark import MARK_FILE, SeqMark

    path = tmp_path / MARK_FILE
    path.write_bytes(b'{"version": 1, "reser')
    state = EngineState(seq=40)
    SeqMark().load(state, path)
    assert state.seq == 40 and state.reserved == 40
    assert not path.exists() and [p.name.split("-")[0] for p in tmp_path.iterdir()] == [f"{MARK_FILE}.corrupt"]
    assert "may repeat earlier ones" in caplog.text


def test_engine_state_keeps_its_lost_gpus_and_reads_files_written_before_them() -> None:
    from nvdaemon.engine import draw_seq

    old = b'{"version": 1, "seq": 7, "active": []}'
    assert engine.load_state(old).lost_gpus == {}
    state = EngineState(seq=7)
    assert draw_seq(state) == 8 and state.unreserved == 0  # no mark kept: nothing counted
    state.reserved = 8
    assert draw_seq(state) == 9 and state.unreserved == 1
