"""A Go agent's config file, unchanged, through ``nvdaemon check-config`` and ``nvdaemon run -config``.

The file is the Go README's quickstart as its chart renders it (contract §1): node, tiers, intervalSeconds, a rule,
``listenAddr: ":PORT"`` and a webhook whose secret is ``${WEBHOOK_SECRET}``. check-config accepts it and prints
one note per deliberate difference; the agent, started with Go's ``-config`` flag on a fixture host, answers on
127.0.0.1 (it listens on every interface) and signs its webhook with the secret from the environment. An empty or
unset secret variable stops both commands with exit 2, naming the variable.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdaemon import cli
from nvdaemon.server.listen import ipv6_only_default
from tests.sinks.helpers import SECRET
from tests.sinks.receiver import Receiver
from tests.test_e2e import ROOT, free_port, wait_for

GO_QUICKSTART = """\
node: go-node
tiers: [core]
intervalSeconds: 1
rules:
  - metric: load1
    device: cpu
    condition: load_high
    severity: warning
    threshold: 8.0
    enterFor: 1
    exitFor: 1
sinks:
  metrics:
    enabled: true
    listenAddr: ":{port}"
  webhook:
    - url: {url}
      secret: ${{WEBHOOK_SECRET}}
"""


def nvdaemon(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdaemon", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WEBHOOK_SECRET", "NODE_NAME")}
    return {**env, **extra}


def test_check_config_accepts_the_go_quickstart_and_notes_each_difference(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(GO_QUICKSTART.format(port=9847, url="https://your-backend.example/hooks/hardware"))
    done = nvdaemon("check-config", str(config), env=clean_env(WEBHOOK_SECRET=SECRET))
    assert done.returncode == 0, done.stderr
    first, *notes = done.stdout.splitlines()
    assert first == f"{config}: ok (node go-node, tiers core, 1 rule(s))"
    prefix = f"{config}: note: "
    assert all(n.startswith(prefix) for n in notes)
    keys = sorted(n.removeprefix(prefix).split(":")[0] for n in notes)
    assert keys == ["rules", "sinks.webhook", "sinks.webhook[0]"]  # per-series state, the spool, whsec_ decoding
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize(("env", "why"), [({}, "is not set"), ({"WEBHOOK_SECRET": ""}, "is set but empty")])
@pytest.mark.parametrize("command", ["check-config", "run"])
def test_an_unset_or_empty_secret_variable_stops_start_up(
    tmp_path: Path, env: dict[str, str], why: str, command: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(GO_QUICKSTART.format(port=free_port(), url="https://your-backend.example/hooks/hardware"))
    args = [command, str(config)] if command == "check-config" else [command, "-config", str(config)]
    done = nvdaemon(*args, env=clean_env(**env, UNRELATED_SECRET="TOPSECRET"))
    assert done.returncode == cli.EXIT_CONFIG
    assert f"sinks.webhook[0].secret: environment variable WEBHOOK_SECRET {why}" in done.stderr
    assert "TOPSECRET" not in done.stdout + done.stderr


@pytest.mark.e2e
def test_the_go_quickstart_runs_and_answers_on_loopback(tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)  # load1 24.51: load_high enters
    port = free_port()
    config = tmp_path / "config.yaml"
    with Receiver(secret=SECRET) as rx:
        # stateDir is the one line added: the Go agent keeps no state, and the tests run as root, where the default
        # is /var/lib/nvdaemon.
        text = GO_QUICKSTART.format(port=port, url=rx.url) + f"stateDir: {tmp_path / 'state'}\n"
        config.write_text(text)
        log = tmp_path / "agent.log"
        cmd = [sys.executable, "-m", "nvdaemon", "run", "-config", str(config), "--host-root", str(host)]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=out, cwd=ROOT, env=clean_env(WEBHOOK_SECRET=SECRET))
        try:
            base = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                try:
                    with urllib.request.urlopen(base + "/readyz", timeout=5) as resp:
                        return bool(resp.status == 200)
                except OSError:
                    return False

            wait_for(ready, "readyz 200 on 127.0.0.1")
            with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
                exposition = resp.read().decode()
            assert 'nodevitals_hw_load1{device="cpu",node="go-node",tier="core"} 24.51' in exposition
            assert 'tier="smart"' not in exposition and 'tier="gpu"' not in exposition
            if ipv6_only_default() is False:  # one dual-stack socket: IPv6 loopback answers too
                with urllib.request.urlopen(f"http://[::1]:{port}/healthz", timeout=5) as resp:
                    assert resp.status == 200
            rx.wait(lambda r: any(x.verified and (x.data or {}).get("condition") == "load_high" for x in r.received))
            assert all(x.verified for x in rx.received)  # signed with the secret from ${WEBHOOK_SECRET}
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=20) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert f"config: {config}" in text
    assert f"[::]:{port}" in text or f"0.0.0.0:{port}" in text  # ":PORT": every interface, not loopback alone


# --- the command line ---------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def root_logger_kept() -> Iterator[None]:
    """``cli.main(["run", ...])`` sets up logging for a process: undo it, or later tests' caplog sees nothing."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(
    "args",
    [
        ["run", "-config", "{file}"],
        ["run", "-config={file}"],
        ["run", "--config", "{file}"],
        ["run", "--config={file}"],
        ["-config", "{file}"],  # the Go agent's whole command line: no subcommand
        ["-config={file}", "--log-level", "error"],
    ],
)
def test_config_flag_in_every_go_and_gnu_spelling(
    tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text("intervalSecond: 10\n")  # a typo: proves this very file was read
    assert cli.main([a.format(file=bad) for a in args]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"{bad}:1: intervalSecond: unknown key" in err
    assert cli.UNKNOWN_KEY_NOTE in err


def test_without_a_flag_the_go_default_path_is_read_when_it_exists(tmp_path: Path) -> None:
    go_default = tmp_path / "etc" / "nodevitals" / "config.yaml"
    assert cli.config_path(None, go_default) is None  # absent: the embedded default
    go_default.parent.mkdir(parents=True)
    go_default.write_text("tier: core\n")
    assert cli.config_path(None, go_default) == str(go_default)
    assert cli.config_path("/other.yaml", go_default) == "/other.yaml"
    assert str(cli.GO_DEFAULT_CONFIG) == "/etc/nodevitals/config.yaml"
