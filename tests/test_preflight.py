"""The host checks ``check-config`` and ``run`` share with a reload: the listen address binds, the token files are
readable. ``check-config`` and ``run`` exit 2 with one message per problem and no traceback; a missing NVSentinel
token is only a warning (the sink re-reads it on every call)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdaemon.configload import parse_config
from nvdaemon.preflight import MAX_TOKEN_BYTES, bind_problem, preflight, token_problem
from tests.test_e2e import ROOT, free_port


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def nvdaemon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdaemon", *args], capture_output=True, text=True, timeout=60, check=False, cwd=ROOT
    )


def test_free_address_binds() -> None:
    assert bind_problem(f"127.0.0.1:{free_port()}") is None
    assert bind_problem("[::1]:0") is None or not socket.has_ipv6


def test_port_held_by_another_process_is_a_problem(held_port: int) -> None:
    why = bind_problem(f"127.0.0.1:{held_port}")
    assert why is not None and "already in use by another process" in why


def test_host_that_does_not_resolve_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    class Unresolvable(socket.socket):
        def bind(self, address: object) -> None:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "socket", Unresolvable)  # no name lookup leaves this machine
    assert bind_problem("agent.example:9847") == "cannot resolve host 'agent.example': Name or service not known"


def test_token_file_checks(tmp_path: Path) -> None:
    token = tmp_path / "token"
    assert token_problem(str(token)) == f"cannot read the token file {token}: No such file or directory"
    token.write_text("\n")
    assert token_problem(str(token)) == f"the token file {token} is empty"
    token.write_bytes(b"x" * (MAX_TOKEN_BYTES + 1))
    assert token_problem(str(token)) == f"the token file {token} is larger than {MAX_TOKEN_BYTES} bytes"
    token.write_text("s3cret-token\n")
    assert token_problem(str(token)) is None


def test_problems_and_warnings_name_the_key_never_the_token(tmp_path: Path, held_port: int) -> None:
    (tmp_path / "empty").write_text("")
    text = (
        f"sinks:\n  metrics: {{listenAddr: '127.0.0.1:{held_port}'}}\n"
        f"  nvsentinel: {{enabled: true, tokenPath: {tmp_path / 'absent'}}}\n"
        f"server: {{apiTokenFile: {tmp_path / 'empty'}}}\n"
    )
    checks = preflight(parse_config(text, "t.yaml", env={}))
    assert [i.path for i in checks.problems] == ["sinks.metrics.listenAddr", "server.apiTokenFile"]
    assert [i.path for i in checks.warnings] == ["sinks.nvsentinel.tokenPath"]
    # A reload skips the address its own server already holds.
    held = preflight(parse_config(text, "t.yaml", env={}), held_addr=f"127.0.0.1:{held_port}")
    assert [i.path for i in held.problems] == ["server.apiTokenFile"]


def test_check_config_reports_each_host_problem_and_exits_2(tmp_path: Path, held_port: int) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"sinks: {{metrics: {{listenAddr: '127.0.0.1:{held_port}'}}}}\nserver: {{apiTokenFile: {tmp_path / 'nope'}}}\n"
    )
    proc = nvdaemon("check-config", str(config))
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == f"{config}: 2 error(s) in config"
    assert "sinks.metrics.listenAddr: cannot listen on 127.0.0.1 port" in lines[1]
    assert "already in use by another process" in lines[1]
    assert f"server.apiTokenFile: cannot read the token file {tmp_path / 'nope'}" in lines[2]
    assert "Traceback" not in proc.stderr
    offline = nvdaemon("check-config", "--offline", str(config))  # a config meant for another machine
    assert offline.returncode == 0 and ": ok (" in offline.stdout


def test_run_refuses_to_start_on_a_host_problem(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"stateDir: {tmp_path / 'state'}\nsinks: {{metrics: {{listenAddr: '127.0.0.1:{free_port()}'}}}}\n"
        f"server: {{apiTokenFile: {tmp_path / 'nope'}}}\n"
    )
    proc = nvdaemon("run", "--config", str(config))
    assert proc.returncode == 2
    assert "server.apiTokenFile: cannot read the token file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state").exists()  # nothing was started


def test_missing_nvsentinel_token_is_a_warning_only(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"sinks:\n  metrics: {{listenAddr: '127.0.0.1:{free_port()}'}}\n"
        f"  nvsentinel: {{enabled: true, tokenPath: {tmp_path / 'token'}}}\n"
    )
    proc = nvdaemon("check-config", str(config))
    assert proc.returncode == 0, proc.stderr
    assert (
        f"warning: {config}: sinks.nvsentinel.tokenPath: cannot read the token file {tmp_path / 'token'}" in proc.stderr
    )
    assert ": ok (" in proc.stdout
