"""Path-valued config keys are checked where every key is: a value no system call can take (a NUL byte, an unpaired
surrogate, a Unix socket path over 107 bytes, "" where a path is required) is a config error at its key path, the
same for ``check-config`` (offline and online), ``run`` (exit 2, no traceback, nothing started) and a SIGHUP reload
(rejected, counted, the running config kept). Such a value used to pass as a string and raise ``ValueError`` in the
task that opened it, which then crash-looped.

The table of keys is read from the schema (``config.FilePath``/``RequiredPath``/``SocketPath``), so a new path key is
in it; ``EXPECTED`` names them, and a string key whose name looks like a path must be one of them.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec.inspect as mi
import pytest
import yaml

from nvdaemon import cli
from nvdaemon.config import Config, ConfigError
from nvdaemon.configload import parse_config
from tests import test_e2e
from tests.test_e2e import ROOT, wait_for
from tests.test_e2e import Agent as AgentProcess

EXPECTED = {
    "procRoot": "required",
    "sysRoot": "required",
    "devRoot": "required",
    "rootfs": "required",
    "stateDir": "optional",
    "server.apiTokenFile": "optional",
    "smart.smartctlPath": "required",
    "smart.devices[]": "required",
    "gpu.fakeScenario": "optional",
    "sinks.webhook[].secretFile": "optional",
    "sinks.nvsentinel.socketPath": "socket",
    "sinks.nvsentinel.tokenPath": "optional",
    "history.dataDir": "optional",
    "nodeExporter.textfileDirectory": "optional",
    "nodeExporter.textfileDir": "optional",
    "nodeExporter.rootfsPath": "optional",
    "dcgmCompat.podResourcesSocket": "socket",
}
LOOKS_LIKE_A_PATH = re.compile(r"(?i)(path|dir|directory|file|root|rootfs|socket|devices)$")

# What turns the key's consumer on, so that the value would be used (on a tree without the check it crash-looped).
URL = "http://127.0.0.1:9/"
CONTEXT: dict[str, dict[str, Any]] = {
    "stateDir": {"sinks.webhook[].url": URL},
    "sinks.webhook[].secretFile": {"sinks.webhook[].url": URL},
    "sinks.nvsentinel.socketPath": {"sinks.nvsentinel.enabled": True},
    "sinks.nvsentinel.tokenPath": {"sinks.nvsentinel.enabled": True},
    "history.dataDir": {"history.enabled": True},
    "dcgmCompat.podResourcesSocket": {"dcgmCompat.enabled": True, "dcgmCompat.podAttribution": True},
    "gpu.fakeScenario": {"tiers": ["gpu"], "gpu.backend": "fake"},
    "smart.smartctlPath": {"tiers": ["smart"]},
    "smart.devices[]": {"tiers": ["smart"]},
    "nodeExporter.textfileDirectory": {"nodeExporter.enabled": True},
    "nodeExporter.textfileDir": {"nodeExporter.enabled": True},
    "nodeExporter.rootfsPath": {"nodeExporter.enabled": True},
}
SECRET = "do-not-echo"  # in every bad value: an error must never quote it
NUL_VALUE = f"/{SECRET}/st\0ate"
NUL = "contains a NUL byte, which no path can hold"


def path_keys(t: mi.Type, path: str = "") -> dict[str, str]:
    """Every path-valued key of the schema under ``t`` (``[]`` for a list item) and its kind."""
    if isinstance(t, mi.Metadata):
        kind = (t.extra or {}).get("path")
        return {path: kind} if kind else path_keys(t.type, path)
    if isinstance(t, mi.UnionType):
        return {k: v for m in t.types for k, v in path_keys(m, path).items()}
    if isinstance(t, mi.ListType):
        return path_keys(t.item_type, path + "[]")
    if isinstance(t, mi.StructType):
        return {k: v for f in t.fields for k, v in path_keys(f.type, f"{path}.{f.encode_name}".lstrip(".")).items()}
    return {}


def string_keys(t: mi.Type, path: str = "") -> set[str]:
    """Every key of the schema whose value is a string or a list of strings, path-valued or not."""
    if isinstance(t, mi.Metadata):
        return string_keys(t.type, path)
    if isinstance(t, mi.UnionType):
        return {k for m in t.types for k in string_keys(m, path)}
    if isinstance(t, mi.ListType):
        return string_keys(t.item_type, path + "[]")
    if isinstance(t, mi.StructType):
        return {k for f in t.fields for k in string_keys(f.type, f"{path}.{f.encode_name}".lstrip("."))}
    return {path} if isinstance(t, mi.StrType) else set()


PATH_KEYS = path_keys(mi.type_info(Config))


def concrete(key: str) -> str:
    """The key path an error names: the first item of a list."""
    return key.replace("[]", "[0]")


def put(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``key`` (``a.b[].c``: the first item of list ``b``) in ``tree``, creating what is missing."""
    node = tree
    parts = key.split(".")
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        name = part.removesuffix("[]")
        if part.endswith("[]"):
            if last:
                node[name] = [value]
                return
            node = node.setdefault(name, [{}])[0]
        elif last:
            node[name] = value
        else:
            node = node.setdefault(name, {})


def bad_config(base: dict[str, Any], key: str, value: str) -> str:
    tree = yaml.safe_load(yaml.safe_dump(base))  # a copy
    for ctx_key, ctx_value in CONTEXT.get(key, {}).items():
        put(tree, ctx_key, ctx_value)
    put(tree, key, value)
    return yaml.safe_dump(tree)


def small_base(tmp_path: Path) -> dict[str, Any]:
    return {
        "node": "n1",
        "tiers": [],
        "intervalSeconds": 1,
        "stateDir": str(tmp_path / "state"),
        "sinks": {"metrics": {"listenAddr": "127.0.0.1:0"}, "stream": {"enabled": False}},
    }


def assert_one_clear_error(stderr: str, key: str, message: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert SECRET not in stderr and "\0" not in stderr, stderr
    assert "1 error(s) in config" in stderr, stderr
    assert f"{key}: {message}" in stderr, stderr


# --- the table ---------------------------------------------------------------------------------------------------


def test_every_path_valued_key_is_typed_as_a_path() -> None:
    assert PATH_KEYS == EXPECTED
    looks = {k for k in string_keys(mi.type_info(Config)) if LOOKS_LIKE_A_PATH.search(k.removesuffix("[]"))}
    assert looks - set(PATH_KEYS) == set(), "a string key named like a path: type it config.FilePath/RequiredPath"


@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online"])
@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_check_config_reports_a_nul_at_its_key(
    key: str, offline: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(bad_config(small_base(tmp_path), key, NUL_VALUE))
    rc = cli.main(["check-config", *(["--offline"] if offline else []), str(config)])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_CONFIG, err
    assert_one_clear_error(err, concrete(key), NUL)


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_run_exits_2_naming_the_key_and_starts_nothing(key: str, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(bad_config(small_base(tmp_path), key, NUL_VALUE))
    cmd = [sys.executable, "-m", "nvdaemon", "run", "--config", str(config)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:  # it started and kept running on a value it cannot use
        pytest.fail(f"run did not exit: {(exc.stderr or b'')[-2000:]!r}")
    assert done.returncode == cli.EXIT_CONFIG, done.stderr
    assert_one_clear_error(done.stderr, concrete(key), NUL)
    assert not (tmp_path / "state").exists()  # nothing started: not even the state directory was made


agent = test_e2e.agent  # a real agent on the fixture host "faulty", with a rule that enters there


def test_reload_with_a_bad_path_is_rejected_counted_and_the_running_config_kept(agent: AgentProcess) -> None:
    good = agent.config.read_text()
    base = yaml.safe_load(good)
    agent.start()
    assert agent.proc is not None
    wait_for(lambda: "load_high" in {c["condition"] for c in agent.status()["conditions"]}, "ENTER")
    log = agent.config.parent / "agent.log"
    for n, key in enumerate(sorted(EXPECTED), start=1):
        agent.config.write_text(bad_config(base, key, NUL_VALUE))
        agent.proc.send_signal(signal.SIGHUP)
        reloads = wait_for(
            lambda n=n: (r := agent.status()["reloads"])["ok"] + r["rejected"] >= n and r,  # type: ignore[misc]
            f"reload {n} done",
        )
        assert reloads["ok"] == 0, f"{key}: the reload was applied"
        assert reloads["rejected"] == n, key
        assert f"{concrete(key)}: {NUL}" in log.read_text(errors="replace"), key
        assert agent.proc.poll() is None and agent.get("/healthz")[0] == 200, key
    text = log.read_text(errors="replace")
    assert "Traceback" not in text and SECRET not in text
    # The running config is still in force: its rule's condition is active, and a good file reloads.
    assert "load_high" in {c["condition"] for c in agent.status()["conditions"]}
    agent.config.write_text(good)
    agent.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: agent.status()["reloads"]["ok"] == 1, "a good reload after the bad ones")
    assert agent.stop()[0] == 0


# --- other values no path can take, and paths from outside the file ---------------------------------------------


def parse_error(text: str, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml", **{"env": {}, **kwargs})
    return str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("stateDir", "/state/\ud800", "contains a character the filesystem encoding cannot hold"),
        ("sinks.webhook[].secretFile", "/\udfff", "contains a character the filesystem encoding cannot hold"),
        ("sinks.nvsentinel.socketPath", "/run/" + "s" * 120, "longer than 107 bytes"),
        ("dcgmCompat.podResourcesSocket", "", "must not be empty"),
        ("smart.smartctlPath", "", "must not be empty"),
        ("smart.devices[]", "", "must not be empty"),
        ("rootfs", "", "must not be empty"),
        ("history.dataDir", "/" + "d" * 4096, "longer than 4095 bytes"),
        ("server.apiTokenFile", "/" + "t" * 256, "has a component longer than 255 bytes"),
    ],
)
def test_other_values_no_path_can_take(key: str, value: str, message: str, tmp_path: Path) -> None:
    err = parse_error(bad_config(small_base(tmp_path), key, value))
    assert f"{concrete(key)}: {message}" in err and "1 error(s)" in err


def test_optional_paths_may_be_empty(tmp_path: Path) -> None:
    tree = small_base(tmp_path)
    for key, kind in EXPECTED.items():
        if kind == "optional" and key != "nodeExporter.rootfsPath":  # rootfsPath "": no filesystem collector
            put(tree, key, "")
    put(tree, "sinks.webhook[].url", URL)
    parse_config(yaml.safe_dump(tree), "t.yaml", env={})


def test_go_keys_are_reported_where_written_not_where_folded(tmp_path: Path) -> None:
    tree = small_base(tmp_path)
    put(tree, "nodeExporter.extraFlags", ["--collector.cpu", "--collector.textfile.directory=/t\0"])
    err = parse_error(yaml.safe_dump(tree))
    assert f"nodeExporter.extraFlags[1]: the textfile directory {NUL}" in err and "1 error(s)" in err
    put(tree, "nodeExporter.extraFlags", [])
    put(tree, "nodeExporter.rootfsPath", "/r\0")
    put(tree, "nodeExporter.textfileDir", "/t\0")
    err = parse_error(yaml.safe_dump(tree))
    assert f"nodeExporter.rootfsPath: {NUL}" in err and f"nodeExporter.textfileDir: {NUL}" in err
    assert "2 error(s)" in err  # not a second time at rootfs and textfileDirectory


def test_a_path_from_the_environment_is_checked_and_never_quoted(tmp_path: Path) -> None:
    text = yaml.safe_dump({**small_base(tmp_path), "stateDir": "${STATE}"})
    err = parse_error(text, env={"STATE": f"/{SECRET}\udcff\ud800"})
    assert "stateDir: contains a character" in err and SECRET not in err


def test_default_state_dir_from_xdg_state_home_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("nvdaemon.configload.os.geteuid", lambda: 1000)  # root's default is fixed
    err = parse_error("node: n1\n", env={"XDG_STATE_HOME": "/x\0"})
    assert f"stateDir: not set, and the default from XDG_STATE_HOME {NUL}" in err


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["check-config", "/etc/x\0.yaml"], "<top>: not a usable config file name: it " + NUL),
        (["run", "--config", "/etc/x\0.yaml"], "<top>: not a usable config file name: it " + NUL),
        (["check-config", "--offline", "--host-root", "/h\0", "CONFIG"], f"--host-root: {NUL}"),
    ],
)
def test_command_line_paths_get_a_clear_error(
    argv: list[str], where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command line cannot carry a NUL (argv is C strings), but ``main`` can be called with one."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(small_base(tmp_path)))
    argv = [str(config) if a == "CONFIG" else a for a in argv]
    # `run` in this process: its logging and malloc settings stay as the test process has them.
    monkeypatch.setattr("nvdaemon.logs.setup", lambda *a: None)
    monkeypatch.setattr(cli, "cap_malloc_arenas", lambda: False)
    monkeypatch.setattr(cli, "raise_nofile", lambda: (0, 0))
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == cli.EXIT_CONFIG and where in err and "\0" not in err, err
