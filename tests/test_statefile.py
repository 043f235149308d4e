"""State files: atomic replace, private modes, damaged files moved aside."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from nvdaemon.statefile import atomic_write, ensure_dir, quarantine, quarantine_db


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_write_creates_with_mode_0600_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "engine.json"
    atomic_write(target, b'{"seq": 1}')
    assert target.read_bytes() == b'{"seq": 1}'
    assert mode(target) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.json"]


def test_atomic_write_replaces_and_keeps_0600(tmp_path: Path) -> None:
    target = tmp_path / "engine.json"
    target.write_bytes(b"old contents that are longer than the new ones")
    target.chmod(0o644)
    old_inode = target.stat().st_ino
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"  # no tail of the old file left
    assert mode(target) == 0o600
    assert target.stat().st_ino != old_inode  # replaced by rename, not rewritten in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine.json"]


def test_atomic_write_repeatedly(tmp_path: Path) -> None:
    target = tmp_path / "seq"
    for i in range(20):
        atomic_write(target, str(i).encode())
    assert target.read_bytes() == b"19"
    assert [p.name for p in tmp_path.iterdir()] == ["seq"]


def test_atomic_write_mode_ignores_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        atomic_write(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert mode(tmp_path / "f") == 0o600


def test_reader_of_the_old_file_keeps_its_contents(tmp_path: Path) -> None:
    target = tmp_path / "state"
    atomic_write(target, b"first")
    with target.open("rb") as reader:
        atomic_write(target, b"second")
        assert reader.read() == b"first"  # the old inode is untouched: never half of each
    assert target.read_bytes() == b"second"


def test_atomic_write_creates_private_parent_dirs(tmp_path: Path) -> None:
    target = tmp_path / "state" / "nested" / "spool.json"
    atomic_write(target, b"[]")
    assert target.read_bytes() == b"[]"
    assert mode(tmp_path / "state" / "nested") & 0o077 == 0


def test_ensure_dir_is_idempotent_and_private(tmp_path: Path) -> None:
    d = tmp_path / "sd"
    ensure_dir(d)
    ensure_dir(d)
    assert d.is_dir()
    assert mode(d) & 0o077 == 0


def test_atomic_write_into_a_missing_unwritable_place_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.raises(OSError):
        atomic_write(blocker / "child", b"x")  # parent is a file
    assert blocker.read_bytes() == b""


def test_quarantine_moves_the_file_aside(tmp_path: Path) -> None:
    target = tmp_path / "engine.json"
    target.write_bytes(b"{garbage")
    before = int(time.time())
    moved = quarantine(target, "not JSON")
    after = int(time.time())
    assert not target.exists()
    assert moved.parent == tmp_path
    assert moved.name.startswith("engine.json.corrupt-")
    assert before <= int(moved.name.rsplit("-", 1)[1]) <= after
    assert moved.read_bytes() == b"{garbage"  # kept for a post-mortem
    assert sorted(p.name for p in tmp_path.iterdir()) == [moved.name]
    # a fresh file can be written where the damaged one was
    atomic_write(target, b"{}")
    assert target.read_bytes() == b"{}"
    assert moved.read_bytes() == b"{garbage"


def test_quarantine_logs_the_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "nvsentinel.json"
    target.write_bytes(b"\x00")
    with caplog.at_level("ERROR", logger="nvdaemon.statefile"):
        moved = quarantine(target, "truncated")
    assert "truncated" in caplog.text
    assert str(moved) in caplog.text


def test_two_quarantines_in_one_second_keep_both_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1_733_140_000.25)
    target = tmp_path / "engine.json"
    target.write_bytes(b"first damage")
    first = quarantine(target, "bad")
    target.write_bytes(b"second damage")
    second = quarantine(target, "bad")
    assert first != second
    assert sorted(p.read_bytes() for p in tmp_path.iterdir()) == [b"first damage", b"second damage"]


def test_quarantine_db_keeps_each_wal_beside_its_database(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    for round_ in ("first", "second"):  # a second quarantine overwrites nothing of the first
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).write_text(round_ + suffix)
        quarantine_db(path, "test")
    moved = [
        p for p in tmp_path.iterdir() if p.name.startswith("spool.db.corrupt-") and p.name[-4:] not in ("-wal", "-shm")
    ]
    assert len(moved) == 2 and not any(path.with_name(path.name + s).exists() for s in ("", "-wal", "-shm"))
    for db in moved:  # sqlite opening a moved copy finds its WAL under the name it looks for
        round_ = db.read_text()
        assert [Path(f"{db}{s}").read_text() for s in ("-wal", "-shm")] == [round_ + "-wal", round_ + "-shm"]
