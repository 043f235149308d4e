"""Config loading: the embedded default, every documented key, ${VAR} expansion, all errors at once with file, line
and key path, no secrets in errors, legacy keys, host_root, semantic checks and the state directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec.inspect as mi
import pytest

from nvdaemon.config import DEFAULT_LISTEN, Config, ConfigError, LoadedConfig
from nvdaemon.configload import default_state_dir, load_config, parse_config

ENV = {"NODE_NAME": "node-from-env"}

# The example of DESIGN.md §5, every key spelled out.
DESIGN_YAML = """\
node: ""
tiers: [core]
intervalSeconds: 15
procRoot: /proc
sysRoot: /sys
devRoot: /dev
rootfs: /
stateDir: /var/lib/nvdaemon
rules:
  - metric: load1
    device: cpu
    condition: load_high
    severity: warning
    threshold: 8.0
    op: ">"
    enterFor: 3
    exitFor: 3
shutdownGraceSeconds: 10
server: {apiTokenFile: ""}
smart: {smartctlPath: smartctl, devices: [], intervalSeconds: 300, timeoutSeconds: 30}
gpu: {xid: true}
spool: {maxEvents: 100000, maxBytes: 268435456}
sinks:
  webhook:
    - url: https://backend.example/hooks/hardware
      secret: ${WEBHOOK_SECRET_0}
  metrics: {enabled: true, listenAddr: "127.0.0.1:9847"}
  nvsentinel: {enabled: false, socketPath: /var/run/nvsentinel.sock,
               tokenPath: /var/run/secrets/nvsentinel/platform-connector/token, agent: nvdaemon}
  stream: {enabled: true}
history: {enabled: false, intervalMinutes: 5, retentionDays: 1825, metrics: [load1]}
nodeExporter: {enabled: false}
dcgmCompat: {enabled: false}
smartctlCompat: {enabled: false}
"""


def parse(text: str, env: dict[str, str] | None = None, source: str = "node.yaml") -> LoadedConfig:
    return parse_config(textwrap.dedent(text), source, env=ENV if env is None else env)


def errors(text: str, env: dict[str, str] | None = None, source: str = "node.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(text, env, source)
    return info.value


def issue_map(err: ConfigError) -> dict[str, tuple[int | None, str]]:
    return {i.path: (i.line, i.message) for i in err.issues}


# --- what loads ---------------------------------------------------------------------------------------------------


def test_embedded_default_loads() -> None:
    loaded = load_config(None, env=ENV)
    assert loaded.source == "<embedded default>"
    assert loaded.tiers == ("core",)
    assert loaded.node == "node-from-env"
    cfg = loaded.config
    assert cfg.interval_seconds == 15.0
    assert cfg.sinks.metrics.enabled is True
    assert cfg.sinks.metrics.listen_addr == DEFAULT_LISTEN
    conditions = {r.condition: r for r in cfg.rules}
    assert set(conditions) == {"pcie_aer_fatal", "memory_hardware_corrupted", "temperature_high"}
    assert conditions["pcie_aer_fatal"].rate is True
    assert conditions["pcie_aer_fatal"].exit_for == 20
    assert conditions["temperature_high"].op == ">="
    assert conditions["temperature_high"].enter_for == 3


def test_design_example_with_every_key_loads() -> None:
    loaded = parse(DESIGN_YAML, env={"WEBHOOK_SECRET_0": "whsec_c2VjcmV0", "NODE_NAME": "n7"})
    cfg = loaded.config
    assert loaded.node == "n7"  # node "" falls back to $NODE_NAME of the given env
    assert loaded.state_dir == Path("/var/lib/nvdaemon")
    assert (cfg.proc_root, cfg.sys_root, cfg.dev_root, cfg.rootfs) == ("/proc", "/sys", "/dev", "/")
    (r,) = cfg.rules
    assert (r.metric, r.device, r.condition, r.severity, r.threshold, r.op) == (
        "load1",
        "cpu",
        "load_high",
        "warning",
        8.0,
        ">",
    )
    assert (r.enter_for, r.exit_for) == (3, 3)
    assert isinstance(r.threshold, float)
    assert cfg.smart.interval_seconds == 300.0
    assert cfg.spool.max_bytes == 268435456
    (hook,) = cfg.sinks.webhook
    assert hook.url == "https://backend.example/hooks/hardware"
    assert hook.secret == "whsec_c2VjcmV0"
    assert cfg.sinks.nvsentinel.token_path == "/var/run/secrets/nvsentinel/platform-connector/token"
    assert cfg.history.metrics == ["load1"]
    assert cfg.shutdown_grace_seconds == 10.0


def test_load_config_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "nvdaemon.yaml"
    path.write_text("node: n1\ntiers: [core, smart]\n")
    loaded = load_config(str(path), env={})
    assert loaded.source == str(path)
    assert (loaded.node, loaded.tiers) == ("n1", ("core", "smart"))


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(str(missing), env={})
    assert str(missing) in str(info.value)
    assert "cannot read" in str(info.value)


def test_empty_file_is_all_defaults() -> None:
    loaded = parse("", env={"NODE_NAME": "x"})
    assert loaded.config == Config()
    assert loaded.tiers == ("core",)


# --- ${VAR} expansion ---------------------------------------------------------------------------------------------


def test_env_expansion_uses_the_given_mapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_HOST", "from-os-environ")
    loaded = parse(
        """\
        node: ${NODE}
        sinks:
          webhook:
            - url: https://${HOOK_HOST}:8443/hooks
              secrets: ["${S1}", "static-${S2}"]
        """,
        env={"NODE": "n-42", "HOOK_HOST": "hooks.example", "S1": "one", "S2": "two"},
    )
    assert loaded.config.node == "n-42"
    (hook,) = loaded.config.sinks.webhook
    assert hook.url == "https://hooks.example:8443/hooks"
    assert hook.secrets == ["one", "static-two"]


def test_env_value_cannot_inject_yaml_structure() -> None:
    loaded = parse("node: ${NODE}\n", env={"NODE": "x\nrules: [oops]"})
    assert loaded.config.node == "x\nrules: [oops]"
    assert loaded.config.rules == []


def test_dollar_without_braces_is_left_alone() -> None:
    assert parse("node: $NODE\n", env={"NODE": "n"}).config.node == "$NODE"


def test_unset_variable_is_an_error_naming_the_key_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_SECRET_0", "set-in-os-environ-but-not-passed")
    err = errors(
        """\
        sinks:
          webhook:
            - url: https://a.example/
              secret: ${WEBHOOK_SECRET_0}
        """,
        env={},
    )
    assert [(i.path, i.line) for i in err.issues] == [("sinks.webhook[0].secret", 4)]
    assert "WEBHOOK_SECRET_0" in err.issues[0].message
    assert "not set" in err.issues[0].message
    assert "node.yaml:4: sinks.webhook[0].secret" in str(err)


# --- errors -------------------------------------------------------------------------------------------------------


def test_unknown_key_rejected_with_did_you_mean() -> None:
    err = errors(
        """\
        intervalSecond: 10
        rules:
          - metric: load1
            condition: load_high
            threshold: 8
            enterfor: 3
        """
    )
    issues = issue_map(err)
    assert set(issues) == {"intervalSecond", "rules[0].enterfor"}
    assert issues["intervalSecond"][0] == 1
    assert "unknown key" in issues["intervalSecond"][1]
    assert "did you mean 'intervalSeconds'" in issues["intervalSecond"][1]
    assert issues["rules[0].enterfor"][0] == 6
    assert "did you mean 'enterFor'" in issues["rules[0].enterfor"][1]


def test_unknown_key_without_a_close_match_lists_known_keys() -> None:
    err = errors("gpu: {zzzzzz: 1}\n")
    ((path, (_, message)),) = issue_map(err).items()
    assert path == "gpu.zzzzzz"
    assert "known keys: backend, fakeScenario, xid" in message


def test_every_error_reported_at_once_with_file_line_and_path() -> None:
    err = errors(
        """\
        node: n1
        tiers: [core, smartt]
        intervalSeconds: fast
        rules:
          - metric: load1
            condition: load_high
            threshold: high
            op: "=>"
          - condition: no_metric
            threshold: 1
        spool:
          maxEvents: 0
        sinks:
          metrics: {listenAddr: "localhost"}
          webhook:
            - url: ftp://x.example/
        """,
        source="/etc/nvdaemon/bad.yaml",
    )
    expected = {
        "tiers[1]": 2,
        "intervalSeconds": 3,
        "rules[0].threshold": 7,
        "rules[0].op": 8,
        "rules[1].metric": 9,  # a missing key is located at its parent
        "spool.maxEvents": 12,
        "sinks.metrics.listenAddr": 14,
        "sinks.webhook[0].url": 16,
    }
    assert {i.path: i.line for i in err.issues} == expected
    text = str(err)
    assert text.splitlines()[0] == f"/etc/nvdaemon/bad.yaml: {len(expected)} error(s) in config"
    for path, line in expected.items():
        assert f"/etc/nvdaemon/bad.yaml:{line}: {path}: " in text
    messages = issue_map(err)
    assert "one of" in messages["tiers[1]"][1]
    assert "a number >= 0.05" in messages["intervalSeconds"][1]
    assert "a number" in messages["rules[0].threshold"][1]
    assert "required key missing" in messages["rules[1].metric"][1]
    assert ">= 1" in messages["spool.maxEvents"][1]
    assert "HOST:PORT" in messages["sinks.metrics.listenAddr"][1]
    assert "http" in messages["sinks.webhook[0].url"][1]


@pytest.mark.parametrize(
    ("line", "path", "expected"),
    [
        ("threshold: .nan", "rules[0].threshold", "non-finite"),
        ("threshold: .inf", "rules[0].threshold", "non-finite"),
        ("enterFor: 2.5", "rules[0].enterFor", "an integer"),
        ("enterFor: true", "rules[0].enterFor", "an integer"),
        ("exitFor: 1.5", "rules[0].exitFor", "an integer"),
        ("severity: fatal", "rules[0].severity", "'critical'"),
        ("rate: 'yes'", "rules[0].rate", "true or false"),
        ("labels: {kind: [some]}", "rules[0].labels.kind", "a string"),
    ],
)
def test_rule_type_errors(line: str, path: str, expected: str) -> None:
    fields = {"metric": "metric: m", "condition": "condition: c", "threshold": "threshold: 1"}
    fields[line.split(":", maxsplit=1)[0]] = line
    body = "\n".join(f"    {f}" for f in fields.values()).replace("    ", "  - ", 1)
    err = errors(f"rules:\n{body}\n")
    assert [i.path for i in err.issues] == [path]
    assert err.issues[0].line == 2 + list(fields).index(line.split(":", maxsplit=1)[0])
    assert expected in err.issues[0].message


SECRET = "whsec_TOPSECRETdeadbeef0123456789"


@pytest.mark.parametrize(
    "yaml_text",
    [
        pytest.param(
            f"sinks:\n  webhook:\n    - url: https://a.example/\n      secret: [{SECRET}]\n", id="list-for-string"
        ),
        pytest.param(f"sinks:\n  webhook:\n    - url: https://a.example/\n      secret: {{k: {SECRET}}}\n", id="map"),
        pytest.param(
            f"sinks:\n  webhook:\n    - url: https://a.example/\n      secrets: {SECRET}\n", id="str-for-list"
        ),
        pytest.param(
            f"sinks:\n  webhook:\n    - url: https://a.example/\n      secrets: [{SECRET}, [{SECRET}]]\n", id="nested"
        ),
        pytest.param(f"server: {{apiTokenFile: [{SECRET}]}}\n", id="token-file"),
        pytest.param(f"sinks:\n  webhook:\n    - url: {SECRET}\n", id="bad-url"),
        pytest.param(f"sinks:\n  webhook:\n    - url: https://a.example/\n      timeoutSeconds: {SECRET}\n", id="num"),
        pytest.param(f"sinks:\n  metrics: {{listenAddr: {SECRET}}}\n", id="listen-addr"),
    ],
)
def test_secrets_never_appear_in_errors(yaml_text: str) -> None:
    err = errors(yaml_text)
    assert err.issues
    assert "TOPSECRET" not in str(err)
    assert all("TOPSECRET" not in i.message for i in err.issues)


def test_secret_from_env_never_appears_in_errors() -> None:
    err = errors(
        "sinks:\n  webhook:\n    - url: ${URL}\n      secret: ${S}\n  metrics: {listenAddr: '${S}'}\n",
        env={"URL": "not-a-url-TOPSECRET", "S": SECRET},
    )
    assert {i.path for i in err.issues} == {"sinks.webhook[0].url", "sinks.metrics.listenAddr"}
    assert "TOPSECRET" not in str(err)


def test_secret_from_env_in_a_choice_key_never_appears_in_errors() -> None:
    err = errors(
        "sinks:\n  webhook:\n    - url: https://a.example/\n      mode: ${S}\n",
        env={"S": SECRET},
    )
    assert [i.path for i in err.issues] == ["sinks.webhook[0].mode"]
    assert "TOPSECRET" not in str(err)


def test_bad_yaml_syntax_is_a_config_error_with_a_line() -> None:
    err = errors("node: n1\ntiers: [core\nintervalSeconds: 15\n")
    (issue,) = err.issues
    assert issue.line == 3
    assert "not valid YAML" in issue.message
    assert "node.yaml:3:" in str(err)


def test_tab_indentation_is_a_config_error() -> None:
    err = errors("sinks:\n\tmetrics: {}\n")
    (issue,) = err.issues
    assert issue.line == 2
    assert "not valid YAML" in issue.message


@pytest.mark.parametrize("text", ["- core\n- smart\n", "just a string\n", "42\n"])
def test_non_mapping_top_level_is_an_error(text: str) -> None:
    err = errors(text)
    (issue,) = err.issues
    assert "mapping" in issue.message
    assert issue.line == 1


@pytest.mark.parametrize(
    ("addr", "ok"),
    [
        ("127.0.0.1:9847", True),
        ("0.0.0.0:1", True),
        ("localhost:65535", True),
        ("[::1]:9847", True),
        ("localhost", False),
        (":9847", True),  # Go's listen syntax: every interface
        (":", False),
        ("127.0.0.1:", False),
        ("127.0.0.1:0", True),  # any free port
        ("127.0.0.1:65536", False),
        ("127.0.0.1:http", False),
        ("127.0.0.1:-1", False),
    ],
)
def test_listen_addr_validation(addr: str, ok: bool) -> None:
    text = f'sinks:\n  metrics:\n    listenAddr: "{addr}"\n'
    if ok:
        assert parse(text).config.sinks.metrics.listen_addr == addr
    else:
        err = errors(text)
        assert [(i.path, i.line) for i in err.issues] == [("sinks.metrics.listenAddr", 3)]


def test_listen_addr_of_wrong_type() -> None:
    err = errors("sinks:\n  metrics: {listenAddr: 9847}\n")
    assert [i.path for i in err.issues] == ["sinks.metrics.listenAddr"]
    assert "a string" in err.issues[0].message


def test_duplicate_rule_rejected() -> None:
    err = errors(
        """\
        rules:
          - {metric: temp_celsius, device: cpu0, condition: hot, threshold: 90}
          - {metric: temp_celsius, device: cpu1, condition: hot, threshold: 90}
          - {metric: temp_celsius, device: cpu0, condition: hot, threshold: 99, severity: critical}
        """
    )
    (issue,) = err.issues
    assert issue.path == "rules[2]"
    assert issue.line == 4
    assert "rules[0]" in issue.message


def test_same_metric_and_device_with_different_conditions_is_fine() -> None:
    loaded = parse(
        """\
        rules:
          - {metric: temp_celsius, condition: warm, threshold: 80}
          - {metric: temp_celsius, condition: hot, threshold: 90, severity: critical}
        """
    )
    assert [r.condition for r in loaded.config.rules] == ["warm", "hot"]


@pytest.mark.parametrize("field", ["metric", "condition"])
def test_rule_names_must_be_identifiers(field: str) -> None:
    rule = {"metric": "load1", "condition": "load_high", field: "bad name!"}
    err = errors(f"rules:\n  - {{metric: '{rule['metric']}', condition: '{rule['condition']}', threshold: 1}}\n")
    assert [i.path for i in err.issues] == [f"rules[0].{field}"]


# --- tiers, host_root, state dir ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tiers"),
    [
        ("tier: gpu\n", ("gpu",)),  # the legacy tier runs alone, as in the Go agent
        ("tiers: [core, smart]\ntier: gpu\n", ("core", "smart")),  # tiers wins, as in the Go agent
        ("tiers: [gpu]\ntier: gpu\n", ("gpu",)),
        ("tiers: [smart, core]\n", ("smart", "core")),
    ],
)
def test_legacy_tier_and_tiers(text: str, tiers: tuple[str, ...]) -> None:
    assert parse(text).tiers == tiers


def test_legacy_tier_is_validated() -> None:
    err = errors("tier: tpu\n")
    assert [i.path for i in err.issues] == ["tier"]


def test_a_long_wrong_choice_is_quoted_only_in_part() -> None:
    """A secret or a whole file pasted into a key with fixed choices is not copied into the error."""
    pasted = "whsec_" + "k" * 4000
    err = errors(f"sinks:\n  webhook:\n    - url: https://a.example/\n      mode: {pasted}\n")
    (issue,) = err.issues
    assert issue.path == "sinks.webhook[0].mode"
    assert "k" * 30 not in str(err) and len(issue.message) < 200
    assert (
        "got 'strucured'"
        in errors("sinks:\n  webhook:\n    - url: https://a.example/\n      mode: strucured\n").issues[0].message
    )  # a short typo is still quoted


def test_host_root_rewrites_roots(tmp_path: Path) -> None:
    text = "procRoot: /elsewhere/proc\nsysRoot: /elsewhere/sys\n"
    path = tmp_path / "c.yaml"
    path.write_text(text)
    host = Path("/host")
    for loaded in (
        parse_config(text, "c.yaml", env=ENV, host_root=host),
        load_config(str(path), env=ENV, host_root=host),
        load_config(None, env=ENV, host_root=host),
    ):
        cfg = loaded.config
        assert (cfg.proc_root, cfg.sys_root, cfg.dev_root, cfg.rootfs) == (
            "/host/proc",
            "/host/sys",
            "/host/dev",
            "/host",
        )


def test_without_host_root_roots_are_as_configured() -> None:
    cfg = parse("procRoot: /hp\nsysRoot: /hs\ndevRoot: /hd\nrootfs: /hr\n").config
    assert (cfg.proc_root, cfg.sys_root, cfg.dev_root, cfg.rootfs) == ("/hp", "/hs", "/hd", "/hr")


def test_default_state_dir_as_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert default_state_dir({"XDG_STATE_HOME": "/xdg"}) == Path("/var/lib/nvdaemon")
    assert parse("node: n\n", env={}).state_dir == Path("/var/lib/nvdaemon")


def test_default_state_dir_as_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", "/from-os-environ")
    assert default_state_dir({"XDG_STATE_HOME": "/xdg"}) == Path("/xdg/nvdaemon")
    assert default_state_dir({}) == tmp_path / ".local" / "state" / "nvdaemon"
    assert default_state_dir({"XDG_STATE_HOME": ""}) == tmp_path / ".local" / "state" / "nvdaemon"
    assert parse("node: n\n", env={"XDG_STATE_HOME": "/xdg"}).state_dir == Path("/xdg/nvdaemon")


def test_explicit_state_dir_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert parse("stateDir: /srv/nv\n").state_dir == Path("/srv/nv")


def test_node_name_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "the-host")
    assert parse("node: explicit\n", env={"NODE_NAME": "env"}).node == "explicit"
    assert parse("tiers: [core]\n", env={"NODE_NAME": "env"}).node == "env"
    assert parse("tiers: [core]\n", env={}).node == "the-host"


def test_duplicate_keys_are_rejected_not_silently_merged() -> None:
    text = "rules:\n  - {metric: load1, condition: a, threshold: 1}\nintervalSeconds: 5\nrules: []\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "dup.yaml", env={})
    assert [(i.path, i.line) for i in err.value.issues] == [("rules", 4)]
    assert "given twice" in str(err.value)


def _leaf_keys(t: mi.Type, path: str = "") -> list[str]:
    """Every leaf key path of a config struct type (``server.maxConnections``, ``rules[].op``)."""
    if isinstance(t, mi.UnionType):
        return [k for m in t.types if isinstance(m, mi.StructType) for k in _leaf_keys(m, path)]
    if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
        return _leaf_keys(t.item_type, path + "[]")
    if isinstance(t, mi.StructType):
        return [k for f in t.fields for k in _leaf_keys(f.type, f"{path}.{f.encode_name}" if path else f.encode_name)]
    return [path]


# Documented in a section of their own (the rule example, Webhook delivery, NVSentinel) of the hand-written pages.
DOCUMENTED_ELSEWHERE = ("rules[]", "spool.", "sinks.webhook[]", "sinks.nvsentinel.")
GENERATED_DOCS = ("config.md", "metrics.md")


def test_config_reference_names_every_key() -> None:
    """docs/config.md lists every key of ``Config`` (as ``key`` or the ``.key`` of a row's group); the keys
    documented in their own sections are named in README.md or the hand-written docs/*.md pages too."""
    root = Path(__file__).resolve().parents[1]
    table = (root / "docs" / "config.md").read_text(encoding="utf-8")
    pages = [root / "README.md", *(p for p in sorted((root / "docs").glob("*.md")) if p.name not in GENERATED_DOCS)]
    prose = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    missing = []
    for key in _leaf_keys(mi.type_info(Config)):
        name = key.rpartition(".")[2].removesuffix("[]")
        if key.startswith(DOCUMENTED_ELSEWHERE):
            if f"`{name}" not in prose and f".{name}" not in prose and f"{name}:" not in prose:
                missing.append(key)
        elif f"`{key.removesuffix('[]')}" not in table and f".{name}`" not in table and f"`{name}`" not in table:
            missing.append(key)
    assert missing == []


def test_config_schema_imports_no_validator_module() -> None:
    """config.py is the bottom layer: the sinks', compat surfaces' and Go-key validators sit above it (configload)."""
    code = "import sys, nvdaemon.config; print(' '.join(sorted(m for m in sys.modules if m.startswith('nvdaemon'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["nvdaemon", "nvdaemon.config", "nvdaemon.configcheck"]
