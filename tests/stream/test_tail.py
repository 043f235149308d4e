"""``nvdaemon tail``: the line format; reconnecting resumes after the last printed id (in process, the hub drops the
client mid-stream); against a real agent subprocess on the faulty fixture host it prints the fixture's faults,
survives the agent restarting without a repeated or missing event, exits 1 when the agent is unreachable at start
and 0 on Ctrl-C."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from nvdaemon.model import Phase
from nvdaemon.sinks.cloudevent import encode
from nvdaemon.sinks.stream.hub import CLOSE_TRY_AGAIN_LATER
from nvdaemon.tail import Options, Tail, format_line
from tests.polling import until
from tests.stream.harness import free_port, make_event, running
from tests.test_e2e import CONFIG, ROOT, Agent, wait_for

pytestmark = pytest.mark.e2e


def test_line_format_rule_event_xid_and_colour_only_when_asked() -> None:
    ev = make_event(3, severity="critical", condition="load_high", device="cpu")
    doc = json.loads(encode(ev)[1])
    line = format_line(doc, colour=False)
    assert line == "2023-11-14T22:13:23Z n1 critical ENTER load_high cpu value=3 threshold=0.5"
    assert "\033[" in format_line(doc, colour=True)
    exit_ = json.loads(encode(make_event(5, phase=Phase.EXIT))[1])
    assert format_line(exit_, colour=False).startswith("2023-11-14T22:14:25Z n1 warning  EXIT  load_high")
    del exit_["time"]  # a document without the envelope's time: the transition's time from data
    assert format_line(exit_, colour=False).startswith("2023-11-14T22:14:25Z ")
    xid = json.loads(encode(make_event(4, condition="gpu_xid", device="gpu0"))[1])
    xid["data"]["detail"] = {"xid": 79, "description": "GPU has fallen off the bus"}
    assert format_line(xid, colour=False).endswith("gpu_xid gpu0 xid=79 GPU has fallen off the bus")


async def test_reconnect_resumes_after_the_last_printed_event(tmp_path: Path) -> None:
    async with running(tmp_path, stream="{clientQueue: 1000}") as srv:
        before = [make_event(i) for i in range(3)]
        await srv.publish(before)
        out, err = io.StringIO(), io.StringIO()
        tail = Tail(Options(url=f"http://{srv.host}:{srv.port}", json=True, replay=2), out, err)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tail.run)
            await until(lambda: out.getvalue().count("\n") >= 2, "two lines printed", timeout=5, step=0.01)
            # The hub drops the client (as it does a slow one) while events keep coming.
            middle = [make_event(i) for i in range(3, 8)]
            await srv.publish(middle[:2])
            await until(lambda: out.getvalue().count("\n") >= 4, "four lines printed", timeout=10, step=0.01)
            (client,) = srv.hub.clients
            srv.hub._drop(client, CLOSE_TRY_AGAIN_LATER, "test", "slow")
            await srv.publish(middle[2:])  # published while it is away: replayed from its cursor
            await until(lambda: out.getvalue().count("\n") >= 7, "seven lines printed", timeout=10, step=0.01)
            # A last event, and its line: a line printed twice would have come before it (one ordered stream).
            last = make_event(8)
            await srv.publish([last])
            await until(lambda: last.id in out.getvalue(), "the last event printed", timeout=10, step=0.01)
            nursery.cancel_scope.cancel()
    printed = [json.loads(line)["id"] for line in out.getvalue().splitlines()]
    assert printed == [e.id for e in [*before[1:], *middle, last]]
    assert "1013" in err.getvalue() and "reconnected, resuming after" in err.getvalue()
    assert tail.connections == 2


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", grace=5.0, port=free_port()))
    a = Agent(tmp_path, host, config)
    yield a
    a.kill()


def _tail(args: list[str], out: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "nvdaemon", "tail", *args]
    with out.open("wb") as stdout, (out.with_suffix(".err")).open("wb") as stderr:
        return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=ROOT)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _lines(path)]


def test_tail_prints_fixture_faults_and_survives_an_agent_restart(agent: Agent, tmp_path: Path) -> None:
    agent.start()
    raw, plain = tmp_path / "raw.jsonl", tmp_path / "plain.txt"
    tails = [_tail([agent.base, "--json", "-n", "1000"], raw), _tail([agent.base, "--severity", "critical"], plain)]
    try:
        wanted = {"load_high", "cpu_package_hot", "pcie_aer_fatal", "memory_pressure"}
        wait_for(lambda: wanted <= {e["data"]["condition"] for e in _events(raw)}, "the fixture's faults in tail")
        wait_for(lambda: "cpu_package_hot" in plain.read_text(), "the critical fault in the filtered tail")
        first_run = [e["id"] for e in agent.status()["recentEvents"]]
        assert agent.stop()[0] == 0
        # While the agent is down the load falls: after the restart the restored load_high EXITs.
        (agent.host / "proc" / "loadavg").write_text("0.50 0.40 0.30 2/1310 223344\n")
        agent.start()

        def exited() -> bool:
            return any(e["data"]["phase"] == "EXIT" for e in _events(raw))

        wait_for(exited, "load_high EXIT after the restart in tail")
        second_run = [e["id"] for e in agent.status()["recentEvents"]]
        printed = _events(raw)
        assert [e["id"] for e in printed] == first_run + second_run  # nothing skipped, nothing repeated
        for doc in printed:  # --json prints the Go agent's data: RFC 3339 times, ended_at only on an EXIT
            data = doc["data"]
            assert "subject" not in doc and ("ended_at" in data) == (data["phase"] == "EXIT")
            assert data["started_at"].endswith("Z") and dt.datetime.fromisoformat(data["started_at"])
            assert doc["time"] == data.get("ended_at", data["started_at"])
        errors = raw.with_suffix(".err").read_text()
        assert "1001" in errors and "reconnected" in errors

        text = plain.read_text()
        assert "\033[" not in text  # not a terminal: no colours
        assert " fixture-node critical ENTER cpu_package_hot hwmon0/coretemp/temp1 value=" in text
        assert "load_high" not in text  # --severity critical filters the warnings out
    finally:
        for proc, sig in zip(tails, (signal.SIGINT, signal.SIGTERM), strict=True):  # Ctrl-C, or a supervisor's stop
            proc.send_signal(sig)
        codes = [proc.wait(timeout=30) for proc in tails]
    assert codes == [0, 0]
    assert agent.stop()[0] == 0


def test_tail_exits_1_when_the_agent_is_unreachable(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "nvdaemon", "tail", url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 1
    assert f"cannot reach the agent at {url}" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(("content", "why"), [(None, "No such file"), (b" \n", "is empty"), (b"x" * 9000, "larger")])
def test_a_bad_token_file_is_one_line_and_exit_1(tmp_path: Path, content: bytes | None, why: str) -> None:
    """``--token-file`` is read by the server's own reader: same whitespace rule, same size limit, no traceback."""
    token = tmp_path / "token"
    if content is not None:
        token.write_bytes(content)
    proc = subprocess.run(
        [sys.executable, "-m", "nvdaemon", "tail", f"http://127.0.0.1:{free_port()}", "--token-file", str(token)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("nvdaemon tail: cannot read --token-file:") and why in proc.stderr
    assert "Traceback" not in proc.stderr
