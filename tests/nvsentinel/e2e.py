"""An agent subprocess on a copy of a fixture host, sending to a test platform-connector (shared e2e setup)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.nvsentinel.conftest import TOKEN
from tests.nvsentinel.connector import FakeConnector
from tests.test_e2e import ROOT, Agent, free_port

BOOT_ID = "11111111-2222-4333-8444-555555555555"


def agent_with_connector(
    tmp_path: Path, host_fixture: str, template: str, **fmt: Any
) -> Iterator[tuple[Agent, FakeConnector]]:
    """Copy ``fixtures/hosts/<host_fixture>`` (with a boot id), write the token and ``template`` filled with
    ``state``, ``port``, ``socket``, ``token`` and ``fmt``; yield the (not yet started) agent and a running
    connector, then kill the agent if it still runs and stop the connector."""
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / host_fixture, host, symlinks=True)
    boot = host / "proc" / "sys" / "kernel" / "random" / "boot_id"
    boot.parent.mkdir(parents=True, exist_ok=True)
    boot.write_text(BOOT_ID + "\n")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    socket = tmp_path / "pc.sock"
    config = tmp_path / "config.yaml"
    config.write_text(template.format(state=tmp_path / "state", port=free_port(), socket=socket, token=token, **fmt))
    connector = FakeConnector(socket, "fixture-node", token).start()
    agent = Agent(tmp_path, host, config)
    try:
        yield agent, connector
    finally:
        agent.kill()
        connector.stop()
