"""The suite's guard (``tests/conftest.py``): an agent built in the test process with the host's devRoot gets a
kernel-log source on an empty directory, never this machine's ``/dev/kmsg``, whose records would add events to the
tests that count them."""

from __future__ import annotations

from pathlib import Path

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config


def test_an_in_process_agent_never_reads_this_machines_kernel_log(tmp_path: Path) -> None:
    loaded = parse_config(f"node: n1\ntiers: []\nstateDir: {tmp_path / 'state'}\n", "test.yaml", env={})
    assert loaded.config.dev_root == "/dev" and loaded.config.kernel_log.enabled
    source = Agent(loaded).kmsg_source(loaded.config)
    assert source.path != Path("/dev/kmsg") and source.path.name == "kmsg"
    assert not source.path.exists()
