"""``nvdaemon state``: the human summary of ``/v1/status`` by default, the document itself with ``--json``.

The formatter is checked on a document taken from a real agent on the faulty fixture host (tests/golden/
status-faulty.json; its summary is tests/golden/state-summary-faulty.txt, regenerated with NVDAEMON_UPDATE_GOLDEN=1),
on variants of it (not ready, failing collectors, stale and mixed-severity conditions, many events, every sink's
shape), and with hypothesis on random and damaged documents: it never raises and never prints a line over ``WIDTH``
or a control character. The command itself is run against a real HTTP server on loopback (``--json`` byte for byte
as before, exit codes) and against a real agent subprocess.
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvdaemon.cli import main
from tests.test_e2e import CONFIG, GRACE, ROOT, Agent, conditions, free_port, wait_for

GOLDEN_DIR = Path(__file__).parent / "golden"
DOC_FILE = GOLDEN_DIR / "status-faulty.json"
SUMMARY_FILE = GOLDEN_DIR / "state-summary-faulty.txt"
DOC: dict[str, Any] = json.loads(DOC_FILE.read_text())
NOW = DOC["tiers"]["core"]["collectedAt"] + 0.25  # a quarter second after the document's last tick


# The formatter is imported where it is used, so that the command-line tests below fail on their own assertions
# (not on an ImportError of the whole file) where no summary exists.
def summarize(doc: object, now: float = NOW, **kw: Any) -> str:
    from nvdaemon.state_summary import summarize as impl

    out: str = impl(doc, now, **kw)
    return out


def width() -> int:
    from nvdaemon.state_summary import WIDTH

    return WIDTH


def doc_with(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(DOC)
    doc.update(changes)
    return doc


def section(text: str, title: str) -> list[str]:
    """The lines of the section whose heading starts with ``title``, heading included (sections end at a blank)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    end = next((i for i in range(start, len(lines)) if not lines[i]), len(lines))
    return lines[start:end]


# ---- the formatter on realistic documents -----------------------------------------------------------------------
def test_summary_of_the_faulty_host_matches_golden() -> None:
    text = summarize(DOC)
    if os.environ.get("NVDAEMON_UPDATE_GOLDEN"):
        SUMMARY_FILE.write_text(text)
    assert text == SUMMARY_FILE.read_text(), "summary drifted; NVDAEMON_UPDATE_GOLDEN=1 regenerates"
    assert len(text.splitlines()) < 30  # against 300 lines of JSON


def test_header_says_node_version_readiness_and_uptime() -> None:
    first = summarize(DOC).splitlines()[0]
    assert first == "node fixture-node  nvdaemon 0.1.0  READY  up 4s"
    assert "NOT READY" in summarize(doc_with(ready=False)).splitlines()[0]
    assert "readiness ?" in summarize(doc_with(ready="yes")).splitlines()[0]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0, "0.0ms"), (0.00227, "2.3ms"), (0.25, "250ms"), (4.9, "4s"), (192, "3m12s"), (7500, "2h05m"),
     (356400, "4d03h")],
)  # fmt: skip
def test_durations_are_humanized(seconds: float, text: str) -> None:
    from nvdaemon.state_summary import human_duration

    assert human_duration(seconds) == text


def test_conditions_by_severity_then_longest_active() -> None:
    doc = copy.deepcopy(DOC)
    base = NOW - 100
    extra = [
        {"condition": "fan_slow", "severity": "info", "device": "fan1", "startedAt": base - 50, "value": 1},
        {"condition": "nic_flap", "severity": "warning", "device": "eth0", "startedAt": base - 3600, "value": 3},
        {"condition": "ecc_dbe", "severity": "critical", "device": "gpu0", "startedAt": base - 10, "stale": True,
         "lastSeen": base + 40},
    ]  # fmt: skip
    doc["conditions"] = extra + doc["conditions"]
    # A row too wide for one line has its value on the next (the stale one here); the rest stay aligned.
    assert section(summarize(doc), "Conditions") == [
        "Conditions (7 active)",
        "  critical  ecc_dbe          gpu0                   active 1m50s",
        "      STALE (last seen 1m00s ago), value ? (threshold ?)",
        "  critical  cpu_package_hot  hwmon0/coretemp/temp1  active 4s     value 97 (threshold 95)",
        "  critical  pcie_aer_fatal   0000:3b:00.0           active 4s     value 1 (threshold 0)",
        "  warning   nic_flap         eth0                   active 1h01m  value 3 (threshold ?)",
        "  warning   memory_pressure  memory                 active 4s     value 35.12 (threshold 20)",
        "  warning   load_high        cpu                    active 4s     value 24.51 (threshold 16)",
        "  info      fan_slow         fan1                   active 2m30s  value 1 (threshold ?)",
    ]


def test_no_conditions_and_no_events_say_so() -> None:
    text = summarize(doc_with(conditions=[], recentEvents=[]))
    assert "Conditions: none active" in text
    assert "Recent events: none since start" in text


def test_at_most_ten_events_newest_first_and_a_count_of_the_rest() -> None:
    events = []
    for seq in range(1, 16):
        ev = copy.deepcopy(DOC["recentEvents"][0])
        ev.update(seq=seq, condition=f"cond{seq:02d}", started_at=NOW - 1000 + seq)
        events.append(ev)
    lines = section(summarize(doc_with(recentEvents=events)), "Recent events")
    assert lines[0] == "Recent events (newest first, 10 of 15)"
    assert [line.split()[4] for line in lines[1:11]] == [f"cond{seq:02d}" for seq in range(15, 5, -1)]
    assert lines[11].startswith("  ... and 5 more")
    assert section(summarize(doc_with(recentEvents=events), max_events=3), "Recent")[0].endswith("3 of 15)")


def test_exit_and_xid_events() -> None:
    enter = copy.deepcopy(DOC["recentEvents"][0])
    exit_ = dict(enter, phase="EXIT", seq=5, ended_at=NOW - 30)  # the EXIT carries its ENTER's started_at
    xid = dict(enter, condition="gpu_xid", device="GPU-0", seq=6, started_at=NOW - 0.5,
               detail={"xid": 79, "description": "GPU has fallen off the bus", "gpu_uuid": "GPU-0"})  # fmt: skip
    assert section(summarize(doc_with(recentEvents=[enter, exit_, xid])), "Recent events") == [
        "Recent events (newest first, 3 of 3)",
        "  just now  ENTER  critical  gpu_xid          GPU-0",
        "      xid=79 GPU has fallen off the bus",
        "  30s ago   EXIT   critical  cpu_package_hot  hwmon0/coretemp/temp1  value 97 (threshold 95)",
        "  4s ago    ENTER  critical  cpu_package_hot  hwmon0/coretemp/temp1  value 97 (threshold 95)",
    ]


def test_tier_with_failing_and_absent_collectors_and_an_overdue_tick() -> None:
    doc = copy.deepcopy(DOC)
    core = doc["tiers"]["core"]
    core["collectors"]["hwmon"].update(success=False, errors=["hwmon3/temp2_input: EIO", "hwmon4: EIO"], errorTotal=12)
    core["collectors"]["rapl"].update(success=False, present=False)
    core["collectedAt"] = NOW - 5
    lines = section(summarize(doc), "Tiers")
    assert lines[1:] == [
        "  core  ticks 16 every 300ms, last 5s ago (overdue), took 2.3ms, 315 samples",
        "    collectors: 7 ok, 1 failing, 1 absent",
        "    hwmon: hwmon3/temp2_input: EIO (+1 more), 12 errors in all",
    ]


def test_every_sink_shape_with_backlog_and_last_error() -> None:
    doc = copy.deepcopy(DOC)
    doc["sinks"].update(
        {
            "nvsentinel": {"socketState": "missing", "pending": 3, "lastError": "socket missing",
                           "lastErrorAt": NOW - 65},
            "history": {"open": True, "series": 4, "lastError": None},
            "webhook:hooks.example:443": {"endpoint": "hooks.example:443", "state": "disabled", "backlog": 0,
                                          "deadLetters": 2, "unspooled": 1, "dropped": {"max_age": 3},
                                          "disabledReason": "410 Gone", "lastError": "HTTP 410"},
        }
    )  # fmt: skip
    doc["bus"]["dropped"]["webhook:hooks.example:443"] = 4
    lines = section(summarize(doc), "Sinks")
    text = "\n".join(lines)
    assert "  nvsentinel  missing, pending 3\n    last error (1m05s ago): socket missing" in text
    assert "  history\n" in text
    assert "  webhook:hooks.example:443  disabled, backlog 0, 1 unspooled, 2 dead letters, 7 dropped" in text
    assert "    disabled: 410 Gone\n    last error: HTTP 410" in text
    assert "  webhook:127.0.0.1:45949  backoff, backlog 4\n    last error: ConnectError" in text


def test_tasks_not_running_are_named_with_their_last_error() -> None:
    doc = copy.deepcopy(DOC)
    name = next(n for n in doc["tasks"] if n.startswith("webhook:"))
    doc["tasks"][name].update(state="backoff", restarts=3, lastError="OSError: disk full", lastErrorAt=NOW - 8)
    doc["tasks"]["stream"]["degraded"] = True
    lines = summarize(doc).splitlines()
    assert lines[2] == "tasks  2 of 4 running"
    assert lines[3] == "  stream  degraded"
    assert lines[4:6] == [f"  {name}  backoff, 3 restarts", "    last error (8s ago): OSError: disk full"]


def test_missing_sections_and_wrong_types_read_as_missing() -> None:
    text = summarize({})
    for line in ("node ?  nvdaemon ?  readiness ?  up ?", "Tiers: ? (not in the document)",
                 "Conditions: ? (not in the document)", "Sinks: ? (not in the document)",
                 "Recent events: ? (not in the document)", "tasks  ? (not in the document)"):  # fmt: skip
        assert line in text
    odd = summarize(doc_with(tiers={"core": {"ticks": "many", "collectors": []}}, conditions=[7, None], sinks=[]))
    assert "  core  ticks many, last ?, took ?, ? samples, collectors ?" in odd  # a string is shown as it is
    assert "Conditions (2 active)" in odd
    assert summarize([1, 2]) == "not a status document: the agent answered a JSON list\n"


def test_control_characters_from_the_document_are_escaped() -> None:
    doc = copy.deepcopy(DOC)
    doc["sinks"]["stream"]["lastError"] = "boom\x1b[2J\r\nfake line"
    text = summarize(doc)
    assert "\x1b" not in text and "\r" not in text
    assert "last error: boom\\x1b[2J\\r\\nfake line" in text


# ---- never a traceback ------------------------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
KEYS = [*DOC, "collectors", "errors", "severity", "startedAt", "detail", "xid", "phase", "lastError", "degraded"]


def check_output(text: str) -> None:
    assert text.endswith("\n")
    for line in text.splitlines():
        assert len(line) <= width(), line
        assert line.isprintable(), line


def damaged(data: st.DataObject, value: Any, depth: int = 0) -> Any:
    """``value`` with some of its nested fields replaced by random JSON, dropped, or left as they are."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            choice = data.draw(st.sampled_from(["keep", "keep", "drop", "replace"]))
            if choice == "replace":
                out[k] = data.draw(JSON)
            elif choice == "keep":
                out[k] = damaged(data, v, depth + 1) if depth < 4 else v
        return out
    if isinstance(value, list):
        return [damaged(data, v, depth + 1) for v in value[:12]]
    return value


@settings(max_examples=200, deadline=None)
@given(JSON)
def test_any_json_value_gives_a_summary(doc: Any) -> None:
    check_output(summarize(doc))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), JSON, max_size=12), st.floats(-1e12, 1e12))
def test_known_keys_with_any_values_give_a_summary(doc: dict[str, Any], now: float) -> None:
    check_output(summarize(doc, now))


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_damaged_real_document_gives_a_summary(data: st.DataObject) -> None:
    check_output(summarize(damaged(data, DOC)))


# ---- the command: a real HTTP server on loopback ----------------------------------------------------------------
class StaticStatus(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/v1/status" else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test output is the command's."""


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(body)``: the base URL of a loopback HTTP server answering ``/v1/status`` with ``body``."""
    servers: list[http.server.HTTPServer] = []

    def start(body: bytes) -> str:
        handler = type("Handler", (StaticStatus,), {"body": body})
        server = http.server.HTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_json_flag_prints_the_document_as_before(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    url = serve(DOC_FILE.read_bytes())
    assert main(["state", url, "--json"]) == 0
    # What `nvdaemon state` printed before the summary existed: the document, indented by 2, keys sorted.
    assert capsys.readouterr().out == json.dumps(DOC, indent=2, sort_keys=True) + "\n"


def test_default_is_the_summary_and_not_ready_still_exits_0(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["state", serve(DOC_FILE.read_bytes())]) == 0
    out = capsys.readouterr().out
    assert out.startswith("node fixture-node  nvdaemon 0.1.0  READY")
    assert "cpu_package_hot" in out and "{" not in out
    assert main(["state", serve(json.dumps(doc_with(ready=False)).encode())]) == 0
    assert "NOT READY" in capsys.readouterr().out


def test_not_json_or_no_agent_exits_1(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["state", serve(b"<html>not an agent</html>")]) == 1
    assert main(["state", f"http://127.0.0.1:{free_port()}"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("nvdaemon state: http://127.0.0.1:") == 2


# ---- end to end: a real agent -------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_state_command_against_a_running_agent(tmp_path: Path) -> None:
    host = tmp_path / "host"
    shutil.copytree(ROOT / "fixtures" / "hosts" / "faulty", host, symlinks=True)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(state=tmp_path / "state", grace=GRACE, port=free_port()))
    agent = Agent(tmp_path, host, config)
    try:
        agent.start()
        wait_for(lambda: ("cpu_package_hot", "hwmon0/coretemp/temp1") in conditions(agent), "cpu_package_hot ENTER")
        cmd = [sys.executable, "-m", "nvdaemon", "state", agent.base]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert out.startswith("node fixture-node  nvdaemon ") and "  READY  " in out.splitlines()[0]
        assert any(line.startswith("  core  ticks ") for line in section(out, "Tiers"))
        hot = [line for line in section(out, "Conditions") if "cpu_package_hot" in line]
        assert hot and hot[0].split()[:3] == ["critical", "cpu_package_hot", "hwmon0/coretemp/temp1"]
        assert "ENTER" in "\n".join(section(out, "Recent events"))
        raw = subprocess.run([*cmd, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=60, check=True)
        doc = json.loads(raw.stdout)
        assert doc["node"] == "fixture-node" and "core" in doc["tiers"]
    finally:
        agent.kill()
