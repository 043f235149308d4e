"""Fixtures: a token file, the test platform-connector on a Unix socket under tmp_path, reconciler factories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvdaemon.config import NvsentinelSink
from nvdaemon.sinks.nvsentinel.sink import Reconciler
from tests.nvsentinel.connector import FakeConnector

NODE = "node-a"
TOKEN = "tok-3f9a1c-secret"  # never to be seen in logs or /v1/status


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    return path


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "pc.sock"


@pytest.fixture
def connector(socket_path: Path, token_file: Path) -> Iterator[FakeConnector]:
    """Not started: tests start it (``connector.start()``), so the socket can be absent first."""
    conn = FakeConnector(socket_path, NODE, token_file)
    yield conn
    conn.stop()


@pytest.fixture
def boot_id(tmp_path: Path) -> Path:
    path = tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True)
    path.write_text("8a3c2f6e-0000-4000-8000-000000000001\n")
    return path


MakeReconciler = Callable[..., Reconciler]


@pytest.fixture
def make_reconciler(tmp_path: Path, socket_path: Path, token_file: Path, boot_id: Path) -> MakeReconciler:
    def make(**overrides: Any) -> Reconciler:
        fields: dict[str, Any] = {
            "enabled": True,
            "socket_path": str(socket_path),
            "token_path": str(token_file),
            "retry_initial_seconds": 0.05,
            "call_timeout_seconds": 2.0,
        }
        fields.update(overrides)
        return Reconciler(
            NvsentinelSink(**fields),
            node=NODE,
            state_path=tmp_path / "state" / "nvsentinel.json",
            boot_id_path=boot_id,
            jitter=lambda: 0.5,  # no jitter: delays are exactly initial x multiplier^n
        )

    return make
