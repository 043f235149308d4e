"""The line a run ends with when it skipped tests (tests/conftest.py): pytest itself, in a subprocess, on a few real
tests, with a PATH that lacks promtool, node_exporter and chromium, so they skip for the reasons a newcomer's machine
gives."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_line

ROOT = Path(__file__).resolve().parent.parent
PROMTOOL = "tests/stack/test_promtool.py::test_promtool_rule_unit_tests"
NODE_EXPORTER = "tests/node_exporter/test_misc_group.py::test_matches_node_exporter_on_tricky_input"
BROWSER = "tests/browser/test_harness.py::test_leaving_by_an_exception_still_ends_the_browser_and_chromedriver"
PASSES = "tests/test_polling.py::test_until_sync_returns_and_times_out"


def pytest_run(tmp_path: Path, *tests: str) -> list[str]:
    """The output lines of ``pytest -q TESTS`` with PATH holding nothing but an empty directory.

    The inner run gets a base temporary directory of its own. Without one it takes the next numbered directory
    beside the outer suite's, and when it ends, before its summary, it deletes the old ones: a whole earlier suite's
    temporary files. Once, on a loaded CI runner, an inner run printed its last test and then no summary for 300 s;
    that clean-up is the one step in between. If the run still hangs, faulthandler prints where each of its threads
    is before it is killed."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(empty), "PYTHONFAULTHANDLER": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'inner'}", *tests]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack on stderr, then the process dies
        out, err = proc.communicate()
        pytest.fail(
            f"the inner pytest did not exit within 300 s; its threads:\n{err[-6000:]}\nits output:\n{out[-2000:]}"
        )
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    return out.splitlines()


def test_one_line_names_every_skipped_group_with_where_how_many_and_why(tmp_path: Path) -> None:
    out = pytest_run(tmp_path, PROMTOOL, NODE_EXPORTER, BROWSER, PASSES)
    lines = [line for line in out if line.startswith("skipped: ")]
    assert lines == out[-1:], out  # one line, the last
    final = re.search(r"(\d+) passed, (\d+) skipped", out[-2])
    assert final is not None, out[-2]
    assert final[1] == "1"
    groups = dict(re.findall(r"(\w+) \(([^)]*)\): ", lines[0]))
    assert set(groups) == {"node_exporter", "promtool", "chromium"}, lines[0]
    assert groups["promtool"] == "tests/stack, 1 test"
    assert groups["chromium"] == "tests/browser, 1 test"
    assert re.fullmatch(r"tests/node_exporter, \d+ tests", groups["node_exporter"])
    counted = sum(int(m) for m in re.findall(r", (\d+) tests?\)", lines[0]))
    assert counted == int(final[2])  # every skip of the run is in the line, no more
    assert "no promtool on PATH (Debian package prometheus)" in lines[0]
    assert "no prometheus-node-exporter on PATH" in lines[0]
    assert "no chromium/chromedriver on PATH (Debian packages chromium, chromium-driver)" in lines[0]


def test_no_line_when_nothing_skipped(tmp_path: Path) -> None:
    out = pytest_run(tmp_path, PASSES)
    assert not [line for line in out if line.startswith("skipped")], out
    assert re.search(r"\b1 passed\b", out[-1]), out[-1]


def test_other_reasons_are_kept_apart_and_verbatim() -> None:
    reports = [
        fake_report("tests/sinks/test_spool_full_disk.py::test_a", "mounting a tmpfs needs root"),
        fake_report("tests/sinks/test_spool_full_disk.py::test_b", "mounting a tmpfs needs root"),
        fake_report("tests/test_e2e.py::test_c", "promtool not installed (Debian package prometheus)"),
        fake_report("tests/podres/test_permission.py::test_d", "needs root and setpriv"),
    ]
    assert skip_line(reports) == (
        "skipped: other (tests/sinks, 2 tests): mounting a tmpfs needs root; "
        "other (tests/podres, 1 test): needs root and setpriv; "
        "promtool (tests/test_e2e.py, 1 test): no promtool on PATH (Debian package prometheus)"
    )


def fake_report(nodeid: str, reason: str) -> pytest.TestReport:
    return pytest.TestReport(nodeid, ("", 0, nodeid), {}, "skipped", ("file.py", 1, f"Skipped: {reason}"), "setup")
