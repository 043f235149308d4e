from __future__ import annotations

from pathlib import Path

import pytest

from tests.node_exporter.oracle import binary

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ROOT / "fixtures" / "hosts"
# Every fixture host; gpunode is the one built to exercise every node_exporter collector we implement.
HOST_NAMES = ("healthy", "faulty", "gpunode")


@pytest.fixture
def node_exporter_binary() -> str:
    exe = binary()
    if exe is None:
        pytest.skip("prometheus-node-exporter is not installed (Debian package prometheus-node-exporter)")
    return exe
