"""Bounded config input: file size, UTF-8, YAML nesting depth and alias expansion, and the range of every number.

Each refusal is a ``ConfigError`` with a message (``check-config`` and ``run`` exit 2 with it), never a traceback, a
RecursionError or a parse that runs for minutes. The billion-laughs file runs in a subprocess with a timeout, so a
regression fails the test instead of eating the machine's memory.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec.inspect as mi
import pytest

from nvdaemon.config import MAX_CONFIG_BYTES, Config, ConfigError
from nvdaemon.configcheck import MAX_ALIAS_NODES, MAX_DEPTH
from nvdaemon.configload import load_config, parse_config

ROOT = Path(__file__).resolve().parent.parent


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml", env={})
    return str(info.value)


def laughs(levels: int, width: int = 9) -> str:
    """The classic alias bomb: each level is a list of ``width`` aliases of the level before."""
    names = "abcdefghijklmnop"
    lines = ["a: &a [" + ",".join(["lol"] * width) + "]"]
    for prev, name in itertools.pairwise(names[:levels]):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nvdaemon", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


# --- aliases ------------------------------------------------------------------------------------------------------


def test_billion_laughs_is_refused_by_check_config(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(laughs(9))
    assert len(bomb.read_bytes()) < 330  # about the 300 bytes of the probe
    proc = check_config(bomb)
    assert proc.returncode == 2, proc.stderr
    assert f"aliases expand to more than {MAX_ALIAS_NODES} values" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_alias_budget_counts_everything_an_alias_brings_in() -> None:
    # 5 levels of 10: 100,000 leaves in all. Small enough to expand on the old code, far over the budget.
    message = refused(laughs(5, width=10))
    assert "aliases expand to more than" in message
    assert "t.yaml:" in message  # located at a line of the file


def test_aliases_within_the_budget_load() -> None:
    text = textwrap.dedent(
        """\
        rules:
          - &base {metric: load1, device: cpu, condition: load_high, threshold: 8, enterFor: 3, exitFor: 3}
          - {<<: *base, condition: load_very_high, threshold: 16, severity: critical}
        """
    )
    rules = parse_config(text, "t.yaml", env={}).config.rules
    assert [(r.condition, r.threshold, r.enter_for) for r in rules] == [("load_high", 8, 3), ("load_very_high", 16, 3)]


def test_alias_inside_its_own_anchor_is_refused() -> None:
    assert "refers to a collection that contains it" in refused("tiers: &t [core, *t]\n")


# --- nesting ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5000])
def test_deep_flow_nesting_is_refused_without_recursion_error(depth: int) -> None:
    message = refused("rules: " + "[" * depth + "]" * depth + "\n")
    assert f"nested more than {MAX_DEPTH} levels deep" in message


def test_deep_block_nesting_is_refused() -> None:
    text = "node:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, MAX_DEPTH + 5))
    assert f"nested more than {MAX_DEPTH} levels deep" in refused(text)


def test_nesting_up_to_the_limit_is_only_a_key_error() -> None:
    depth = MAX_DEPTH - 2  # the top mapping and the innermost scalar are levels too
    message = refused("x: " + "[" * depth + "1" + "]" * depth + "\n")
    assert "nested" not in message and "x: unknown key" in message


# --- size and encoding --------------------------------------------------------------------------------------------


def test_file_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        load_config(str(big), env={})
    with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
        parse_config(big.read_text(), "big.yaml", env={})


def test_file_at_the_size_cap_loads(tmp_path: Path) -> None:
    body = b"intervalSeconds: 30\n"
    ok = tmp_path / "ok.yaml"
    ok.write_bytes(body + b"#" * (MAX_CONFIG_BYTES - len(body) - 1) + b"\n")
    assert load_config(str(ok), env={}).config.interval_seconds == 30


def test_non_utf8_byte_is_a_config_error_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"node: n1\ntiers: [core]\nrules: []  # caf\xe9\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(bad), env={})
    assert [(i.line, i.message) for i in info.value.issues] == [(3, "not UTF-8 text: byte 0xe9 at offset 39")]


@pytest.mark.parametrize(
    "content",
    [b"node: caf\xe9\n", b"rules: " + b"[" * 5000 + b"]" * 5000 + b"\n"],
    ids=["non-utf8", "deep"],
)
def test_check_config_reports_bad_input_with_exit_2_and_no_traceback(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    proc = check_config(path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"{path}: 1 error(s) in config")
    assert "Traceback" not in proc.stderr


# --- ranges -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "path", "bound"),
    [
        ("intervalSeconds: 0.000000001", "intervalSeconds", ">= 0.05"),
        ("intervalSeconds: 90000", "intervalSeconds", "<= 86400"),
        ("smart: {intervalSeconds: 0.1}", "smart.intervalSeconds", ">= 0.25"),
        ("collectorTimeoutSeconds: 601", "collectorTimeoutSeconds", "<= 600"),
        ("shutdownGraceSeconds: 86400", "shutdownGraceSeconds", "<= 600"),
        ("server: {headerTimeoutSeconds: 1.0e9}", "server.headerTimeoutSeconds", "<= 600"),
        ("server: {maxRequestBytes: 1073741824}", "server.maxRequestBytes", "<= 16777216"),
        ("smart: {timeoutSeconds: 3601}", "smart.timeoutSeconds", "<= 600"),
        ("smart: {maxConcurrent: 1000}", "smart.maxConcurrent", "<= 64"),
        ("spool: {maxEvents: 1000000000000}", "spool.maxEvents", "<= 10000000"),
        ("sinks: {stream: {clientQueue: 1000000000}}", "sinks.stream.clientQueue", "<= 100000"),
        ("sinks: {stream: {pingSeconds: 0.0001}}", "sinks.stream.pingSeconds", ">= 0.1"),
        ("sinks: {nvsentinel: {retryInitialSeconds: 1.0e-9}}", "sinks.nvsentinel.retryInitialSeconds", ">= 0.01"),
        (
            "sinks: {webhook: [{url: 'https://a.example/', backoffMaxSeconds: 1.0e-9}]}",
            "sinks.webhook[0].backoffMaxSeconds",
            ">= 0.01",
        ),
        ("history: {intervalMinutes: 100000}", "history.intervalMinutes", "<= 1440"),
        ("dcgmCompat: {podResourcesTimeoutSeconds: 1.0e10}", "dcgmCompat.podResourcesTimeoutSeconds", "<= 600"),
        (
            "nodeExporter: {filesystem: {mountTimeoutSeconds: 1.0e6}}",
            "nodeExporter.filesystem.mountTimeoutSeconds",
            "<= 600",
        ),
    ],
)
def test_numbers_out_of_range_are_refused_with_the_range(text: str, path: str, bound: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text + "\n", "t.yaml", env={})
    assert [i.path for i in info.value.issues] == [path]
    assert bound in info.value.issues[0].message


@pytest.mark.parametrize(
    "text",
    [
        "intervalSeconds: 0.05",  # the floor itself (fixture tests tick this fast)
        "intervalSeconds: 86400",
        "smart: {intervalSeconds: 0.25, timeoutSeconds: 600, maxConcurrent: 64}",
        "collectorTimeoutSeconds: 600",
        "server: {maxRequestBytes: 16777216, headerTimeoutSeconds: 0.5}",
    ],
)
def test_numbers_at_the_bounds_load(text: str) -> None:
    parse_config(text + "\n", "t.yaml", env={})


# Numbers that may be as large as a user likes: a rule's threshold, and counts of samples (a large one only delays).
UNBOUNDED = {"rules[].threshold", "rules[].enterFor", "rules[].exitFor"}


def _numbers(t: mi.Type, path: str = "") -> list[tuple[str, mi.IntType | mi.FloatType]]:
    if isinstance(t, mi.UnionType):
        return [n for m in t.types for n in _numbers(m, path)]
    if isinstance(t, mi.ListType | mi.DictType):
        item = t.item_type if isinstance(t, mi.ListType) else t.value_type
        return _numbers(item, path + "[]")
    if isinstance(t, mi.StructType):
        return [n for f in t.fields for n in _numbers(f.type, f"{path}.{f.encode_name}" if path else f.encode_name)]
    return [(path, t)] if isinstance(t, mi.IntType | mi.FloatType) else []


def test_every_number_has_a_ceiling() -> None:
    """A new timeout or size without ``le`` fails here (the module docstring's promise: every number has a range)."""
    numbers = _numbers(mi.type_info(Config))
    assert {path for path, _ in numbers} >= UNBOUNDED
    assert [path for path, t in numbers if t.le is None and t.lt is None and path not in UNBOUNDED] == []
