"""Suite-wide: the tests run the same inside a Kubernetes pod (a CI runner) as outside one, and a run that skipped
tests ends by saying which and why.

``KUBERNETES_SERVICE_HOST`` makes the agent refuse a config without ``node:`` or ``NODE_NAME`` (the hostname would be
the pod's name); tests that mean to check that set it themselves. Removed here, before any test or agent subprocess
reads the environment.

``autojump_clock`` is the suite's own (``tests/clock.py``): it holds the mock clock while a worker thread works.

This machine's kernel log: an agent built in the test process never reads the real ``/dev/kmsg`` (its devRoot
``/dev`` is swapped for an empty directory when the kernel-log source is built). Its records would add events to
tests that count them: the suite's own full-disk tests fill a loop-mounted ext4, and the kernel's ``EXT4-fs error``
lines match the built-in ``filesystem_error`` rule for an hour after. Tests of the kernel log point devRoot at a
fixture host, or (``tests/kmsg/test_real_kmsg.py``) build the source on ``/dev/kmsg`` themselves. Agents started as
subprocesses read their config's devRoot; a test of one that counts events sets ``kernelLog: {enabled: false}``.

The skip line: every skip of the run (a test's ``pytest.skip``, a ``skipif`` mark, a skipped module) is put in a
group, one per missing tool (``SKIP_GROUPS``, matched on the skip's reason) or else one per distinct reason, and the
run ends with ONE line, ``skipped: GROUP (DIRS, N tests): WHY; ...``. Nothing is printed when nothing skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from nvdaemon.config import Config
from nvdaemon.kmsg import service as kmsg_service
from tests.clock import autojump_clock, thread_hold

__all__ = ["autojump_clock", "thread_hold"]  # the suite's own, over pytest-trio's: see tests/clock.py

os.environ.pop("KUBERNETES_SERVICE_HOST", None)


@pytest.fixture(autouse=True)
def no_host_kernel_log(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """In-process agents with the host's devRoot read an empty directory's kernel log (absent): see above."""
    real = kmsg_service.build_source

    def build_source(c: Config, *args: Any, **kwargs: Any) -> Any:
        if os.path.normpath(c.dev_root) == "/dev":
            empty = tmp_path_factory.mktemp("no-host-kmsg")
            c = msgspec.structs.replace(c, dev_root=str(empty))
        return real(c, *args, **kwargs)

    monkeypatch.setattr(kmsg_service, "build_source", build_source)


# (group, pattern on the skip reason, why). The tools `make test` fetches or installs itself where it can
# (scripts/fetch-helm, scripts/ensure-test-deps); their reasons name the tool.
SKIP_GROUPS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("helm", re.compile(r"\bhelm\b"), "no helm in .tools or on PATH (scripts/fetch-helm could not fetch it: offline?)"),
    ("promtool", re.compile(r"\bpromtool\b"), "no promtool on PATH (Debian package prometheus)"),
    ("prometheus", re.compile(r"\bprometheus not found"), "no prometheus server on PATH (Debian package prometheus)"),
    (
        "node_exporter",
        re.compile(r"node.exporter"),
        "no prometheus-node-exporter on PATH (Debian package prometheus-node-exporter)",
    ),
    (
        "chromium",
        re.compile(r"\bno chrom(?:ium|edriver) on PATH\b"),
        "no chromium/chromedriver on PATH (Debian packages chromium, chromium-driver)",
    ),
)


@dataclass
class SkipGroup:
    why: str
    places: set[str] = field(default_factory=set)
    count: int = 0


def skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    """The reason pytest shows for a skip: ``longrepr`` is ``(path, line, "Skipped: reason")`` for every skip."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def place(nodeid: str) -> str:
    """``tests/deploy`` for a test under a directory, ``tests/test_e2e.py`` for a top-level test file."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else path


def group_skips(reports: Iterable[pytest.TestReport | pytest.CollectReport]) -> dict[str, SkipGroup]:
    groups: dict[str, SkipGroup] = {}
    for report in reports:
        reason = skip_reason(report)
        name, why = next(((g, w) for g, pattern, w in SKIP_GROUPS if pattern.search(reason)), ("other", reason))
        key = name if name != "other" else f"other: {reason}"
        group = groups.setdefault(key, SkipGroup(why))
        group.places.add(place(report.nodeid))
        group.count += 1
    return groups


def skip_line(reports: Iterable[pytest.TestReport | pytest.CollectReport]) -> str | None:
    groups = group_skips(reports)
    if not groups:
        return None
    parts = []
    for key, g in sorted(groups.items(), key=lambda kv: (-kv[1].count, kv[0])):
        name = key.split(":", 1)[0]
        noun = "test" if g.count == 1 else "tests"
        parts.append(f"{name} ({', '.join(sorted(g.places))}, {g.count} {noun}): {g.why}")
    return "skipped: " + "; ".join(parts)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Here rather than in ``pytest_terminal_summary``: that runs before the ``-ra`` listing and the final counts, and
    the line is meant to be the last thing a run prints."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not isinstance(reporter, pytest.TerminalReporter):
        return
    line = skip_line(r for r in reporter.stats.get("skipped", []) if r.skipped)
    if line is not None:
        reporter.write_line(line, yellow=True, bold=True)
