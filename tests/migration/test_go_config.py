"""The Go agent's (nodevitals) config keys, contract §1: each accepted with its Go meaning and asserted on what it
changes (the tiers that run, the roots collectors read, the rules the engine applies, the binds the server makes,
the collectors and files the node_exporter surface reads, where the history database lands), plus the note line
check-config prints where we differ on purpose."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nvdaemon import engine
from nvdaemon.app import Agent
from nvdaemon.collectors.base import HostRoots
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.options import DEFAULTS
from nvdaemon.compat.node_exporter.surface import node_exporter_collectors
from nvdaemon.config import ConfigError, LoadedConfig
from nvdaemon.configload import parse_config
from nvdaemon.history.core import DEFAULT_METRICS
from nvdaemon.history.service import HistorySink, history_path
from nvdaemon.model import Phase, Sample
from nvdaemon.server.listen import bind_list
from tests.history.helpers import T0, Wall, make_agent, make_sink, serving, temps
from tests.node_exporter.oracle import collect_once

ROOT = Path(__file__).resolve().parents[2]


def parse(text: str, env: dict[str, str] | None = None) -> LoadedConfig:
    return parse_config(textwrap.dedent(text), "go.yaml", env={"NODE_NAME": "n1"} if env is None else env)


def issues(text: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """Key path -> its messages, one per line."""
    with pytest.raises(ConfigError) as info:
        parse(text, env)
    found: dict[str, str] = {}
    for i in info.value.issues:
        found[i.path] = "\n".join(filter(None, [found.get(i.path), i.message]))
    return found


def notes_about(loaded: LoadedConfig, key: str) -> list[str]:
    return [n for n in loaded.notes if n.startswith(key)]


# --- node ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "env", "node"),
    [
        ("node: gpu-17\n", {"NODE_NAME": "from-env"}, "gpu-17"),
        ('node: ""\n', {"NODE_NAME": "from-env"}, "from-env"),  # Go: empty -> $NODE_NAME
        ("{}\n", {"NODE_NAME": "from-env"}, "from-env"),
    ],
)
def test_node_falls_back_to_node_name(text: str, env: dict[str, str], node: str) -> None:
    loaded = parse(text, env)
    assert Agent(loaded).node == node
    assert notes_about(loaded, "node:") == []


def test_node_without_node_name_is_the_hostname_and_noted() -> None:
    loaded = parse('node: ""\n', env={})
    assert loaded.node  # the Go agent would send ""
    assert len(notes_about(loaded, "node:")) == 1


# --- tier / tiers -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tiers"),
    [
        ("tier: smart\n", ("smart",)),  # the legacy single tier runs alone (it used to add core)
        ("tier: gpu\n", ("gpu",)),
        ("tier: core\n", ("core",)),
        ("tiers: [gpu, core]\n", ("gpu", "core")),  # order kept
        ('tiers: [smart, "", core, smart, ""]\n', ("smart", "core")),  # blanks and repeats dropped
        ("tiers: []\ntier: smart\n", ("smart",)),  # empty tiers: [tier]
        ('tiers: [""]\ntier: gpu\n', ("gpu",)),
        ("tiers: []\n", ("core",)),  # nothing: core
        ('tier: ""\n', ("core",)),
        ("tiers:\ntier: smart\n", ("smart",)),  # YAML null: as if absent
        ("{}\n", ("core",)),
        ("tiers: [core, smart]\ntier: gpu\n", ("core", "smart")),  # both: tiers wins, as in Go
    ],
)
def test_tiers_resolve_as_in_go(text: str, tiers: tuple[str, ...]) -> None:
    loaded = parse(text)
    assert loaded.tiers == tiers
    assert [t for t in Agent(loaded).active_tiers()] == list(tiers)  # what app.py starts a loop for


def test_tier_ignored_beside_tiers_is_noted() -> None:
    assert len(notes_about(parse("tiers: [core]\ntier: smart\n"), "tier:")) == 1
    assert notes_about(parse("tier: smart\n"), "tier:") == []


@pytest.mark.parametrize("text", ["tiers: [core, tpu]\n", "tier: tpu\n", "tiers: [core]\ntier: tpu\n"])
def test_unknown_tier_is_an_error(text: str) -> None:
    found = issues(text)
    assert len(found) == 1
    assert "one of" in next(iter(found.values()))


# --- intervalSeconds, rules ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds", "noted"),
    [("30", 30.0, False), ("0", 15.0, True), ("-5", 15.0, True), ("0.0", 15.0, True), (None, 15.0, False)],
)
def test_interval_seconds_at_or_below_zero_is_15(value: str | None, seconds: float, noted: bool) -> None:
    loaded = parse(f"intervalSeconds: {value}\n" if value is not None else "{}\n")
    assert loaded.config.interval_seconds == seconds
    assert Agent(loaded).interval("core") == seconds  # the tier loop's period
    assert len(notes_about(loaded, "intervalSeconds:")) == (1 if noted else 0)


GO_RULE = """\
rules:
  - metric: load1
    device: ""
    condition: load_high
    severity: warning
    threshold: 8.0
    enterFor: {enter}
    exitFor: {exit}
"""


def run_rule(loaded: LoadedConfig, ticks: list[dict[str, float]]) -> list[tuple[int, str, str]]:
    """Feed ticks of load1 per device through the real engine; (tick, device, phase) of every transition."""
    state, rules = engine.EngineState(), engine.compile_rules(loaded.config.rules)
    out = []
    for i, values in enumerate(ticks):
        samples = [Sample("load1", dev, v) for dev, v in values.items()]
        for ev in engine.evaluate(
            state, rules, samples, tier="core", node="n1", now=T0 + i, new_id=lambda now: f"id-{now}"
        ):
            out.append((i, ev.device, ev.phase.value))
    return out


@pytest.mark.parametrize(("enter", "exit"), [(0, 0), (-3, 1), (1, -1)])
def test_enter_for_and_exit_for_below_one_mean_one(enter: int, exit: int) -> None:
    loaded = parse(GO_RULE.format(enter=enter, exit=exit))
    (rule,) = loaded.config.rules
    assert (rule.enter_for, rule.exit_for) == (1, 1)
    assert len(notes_about(loaded, "rules[0].")) == (enter < 1) + (exit < 1)
    # One breaching sample enters, one clear sample exits; device "" tracks every device on its own.
    assert run_rule(loaded, [{"a": 9.0, "b": 1.0}, {"a": 1.0, "b": 9.0}]) == [
        (0, "a", Phase.ENTER.value),
        (1, "a", Phase.EXIT.value),
        (1, "b", Phase.ENTER.value),
    ]


def test_go_rule_fields_mean_what_they_meant() -> None:
    loaded = parse(GO_RULE.format(enter=2, exit=3))
    (rule,) = loaded.config.rules
    assert (rule.metric, rule.device, rule.condition, rule.severity, rule.threshold, rule.op) == (
        "load1",
        "",
        "load_high",
        "warning",
        8.0,
        ">",  # the Go agent's only comparison
    )
    ticks = [{"cpu": 9.0}, {"cpu": 9.0}, {"cpu": 8.0}, {"cpu": 1.0}, {"cpu": 1.0}]  # 8.0 is not > 8.0
    assert run_rule(loaded, ticks) == [(1, "cpu", "ENTER"), (4, "cpu", "EXIT")]
    assert len(notes_about(loaded, "rules:")) == 1  # per-series state, noted once


def test_go_rule_without_threshold_or_severity_takes_their_zero_values() -> None:
    loaded = parse("rules: [{metric: load1, device: cpu, condition: load_high}]\n")
    (rule,) = loaded.config.rules
    assert (rule.threshold, rule.severity) == (0.0, "warning")
    assert run_rule(loaded, [{"cpu": 0.5}, {"cpu": 0.0}]) == [(0, "cpu", "ENTER"), (1, "cpu", "EXIT")]
    assert len(notes_about(loaded, "rules[0].threshold")) == 1
    assert len(notes_about(loaded, "rules[0].severity")) == 1


def test_op_other_than_greater_is_noted() -> None:
    loaded = parse("rules: [{metric: m, condition: c, threshold: 1, op: '<'}, {metric: n, condition: c, threshold: 1}]")
    assert notes_about(loaded, "rules[0].op") and not notes_about(loaded, "rules[1].op")


# --- procRoot / sysRoot / devRoot ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "roots"),
    [
        ("{}\n", ("/proc", "/sys", "/dev")),
        ('procRoot: ""\nsysRoot: ""\ndevRoot: ""\n', ("/proc", "/sys", "/dev")),  # Go: "" is the default
        ("procRoot: /host/proc\nsysRoot: /host/sys\ndevRoot: /host/dev\n", ("/host/proc", "/host/sys", "/host/dev")),
    ],
)
def test_roots(text: str, roots: tuple[str, str, str]) -> None:
    r = Agent(parse(text)).roots
    assert (str(r.proc), str(r.sys), str(r.dev)) == roots


# --- sinks.webhook[].secret ---------------------------------------------------------------------------------------

HOOK = "sinks:\n  webhook:\n    - url: https://hooks.example/hardware\n      secret: {secret}\n"


def test_secret_that_is_exactly_a_variable_takes_its_value() -> None:
    loaded = parse(HOOK.format(secret="${WEBHOOK_SECRET}"), env={"WEBHOOK_SECRET": "s3cr3t-from-env"})
    assert loaded.config.sinks.webhook[0].secret == "s3cr3t-from-env"


@pytest.mark.parametrize(
    ("env", "why"),
    [({}, "not set"), ({"WEBHOOK_SECRET": ""}, "set but empty")],
)
def test_secret_variable_unset_or_empty_is_an_error_naming_it(env: dict[str, str], why: str) -> None:
    found = issues(HOOK.format(secret="${WEBHOOK_SECRET}"), env={"OTHER": "TOPSECRET", **env})
    assert list(found) == ["sinks.webhook[0].secret"]
    assert "WEBHOOK_SECRET" in found["sinks.webhook[0].secret"] and why in found["sinks.webhook[0].secret"]


@pytest.mark.parametrize(
    ("hook", "path"),
    [
        ("secrets: ['${EMPTY}', '${FULL}']", "sinks.webhook[0].secrets[0]"),
        ("secret: 'v1-${EMPTY}'", "sinks.webhook[0].secret"),
        ("secretFile: '${EMPTY}'", "sinks.webhook[0].secretFile"),
        ("headers: {Authorization: 'Bearer ${EMPTY}'}", "sinks.webhook[0].headers.Authorization"),
    ],
)
def test_an_empty_expansion_of_any_secret_is_an_error(hook: str, path: str) -> None:
    text = f"sinks:\n  webhook:\n    - url: https://hooks.example/\n      {hook}\n"
    found = issues(text, env={"EMPTY": "", "FULL": "TOPSECRET"})
    assert path in found and "EMPTY" in found[path]
    assert all("TOPSECRET" not in m for m in found.values())


def test_empty_api_token_file_variable_is_an_error() -> None:
    assert "server.apiTokenFile" in issues("server: {apiTokenFile: '${TOKEN_FILE}'}\n", env={"TOKEN_FILE": ""})


def test_go_style_variable_name_we_cannot_expand_is_an_error_not_a_literal_key() -> None:
    found = issues(HOOK.format(secret="${WEBHOOK-SECRET}"), env={"WEBHOOK-SECRET": "x"})
    assert list(found) == ["sinks.webhook[0].secret"]


def test_literal_secret_and_deliberately_unsigned_webhook_load() -> None:
    assert parse(HOOK.format(secret="plain-literal")).config.sinks.webhook[0].secret == "plain-literal"
    assert parse(HOOK.format(secret='""')).config.sinks.webhook[0].secret == ""  # Go: a literal "" is unsigned


def test_variables_outside_the_secret_are_noted() -> None:
    env = {"WEBHOOK_SECRET": "s", "HOST": "h.example"}
    assert notes_about(parse(HOOK.format(secret="${WEBHOOK_SECRET}"), env), "sinks.webhook[0].url") == []
    text = "sinks:\n  webhook:\n    - url: https://${HOST}/hook\n      secret: ${WEBHOOK_SECRET}\n"
    assert len(notes_about(parse(text, env), "sinks.webhook[0].url")) == 1


# --- sinks.metrics ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("metrics", "listen", "binds_dual_stack", "noted"),
    [
        ('{listenAddr: ""}', ":9847", ["[::]:9847"], False),  # Go: "" is :9847
        ('{listenAddr: ":9100"}', ":9100", ["[::]:9100"], False),
        ('{listenAddr: "0.0.0.0:9100"}', "0.0.0.0:9100", ["0.0.0.0:9100"], False),
        ('{listenAddr: "[::1]:9100"}', "[::1]:9100", ["[::1]:9100"], False),
        ("{enabled: true}", "127.0.0.1:9847", ["127.0.0.1:9847"], True),  # absent: loopback only, noted
    ],
)
def test_listen_addr(metrics: str, listen: str, binds_dual_stack: list[str], noted: bool) -> None:
    loaded = parse(f"sinks:\n  metrics: {metrics}\n")
    assert loaded.config.sinks.metrics.listen_addr == listen
    assert bind_list(listen, lambda: False) == binds_dual_stack
    assert len(notes_about(loaded, "sinks.metrics.listenAddr")) == (1 if noted else 0)


@pytest.mark.parametrize(
    ("v6only", "binds"),
    [(False, ["[::]:9847"]), (True, ["0.0.0.0:9847", "[::]:9847"]), (None, ["0.0.0.0:9847"])],
)
def test_every_interface_binds_by_what_the_kernel_allows(v6only: bool | None, binds: list[str]) -> None:
    assert bind_list(":9847", lambda: v6only) == binds


def test_metrics_enabled_false_is_ignored_and_noted() -> None:
    loaded = parse("sinks:\n  metrics: {enabled: false, listenAddr: ':9847'}\n")
    assert loaded.config.sinks.metrics.enabled is False
    assert len(notes_about(loaded, "sinks.metrics.enabled")) == 1
    assert notes_about(parse("sinks:\n  metrics: {enabled: true, listenAddr: ':9847'}\n"), "sinks.metrics.en") == []


# --- nodeExporter -------------------------------------------------------------------------------------------------


def surface_names(loaded: LoadedConfig) -> list[str]:
    """The node_exporter collectors the core tier runs under this config."""
    return [getattr(c, "node_name", "") for c in node_exporter_collectors(loaded.config, TABLE)]


@pytest.mark.parametrize(
    ("textfile", "directory"),
    [
        ("{textfileDir: /var/lib/node_exporter/textfile_collector}", "/var/lib/node_exporter/textfile_collector"),
        ("{textfileDirectory: /ours}", "/ours"),
        ("{textfileDir: /same, textfileDirectory: /same}", "/same"),
        ('{textfileDir: "", textfileDirectory: /ours}', "/ours"),
        ("{enabled: true}", ""),
    ],
)
def test_textfile_dir_is_the_textfile_directory(textfile: str, directory: str) -> None:
    assert parse(f"nodeExporter: {textfile}\n").config.node_exporter.textfile_directory == directory


def test_textfile_dir_is_read_by_the_textfile_collector(tmp_path: Path) -> None:
    (tmp_path / "site.prom").write_text("# TYPE site_rack_position gauge\nsite_rack_position 7\n")
    loaded = parse(f"nodeExporter: {{enabled: true, textfileDir: {tmp_path}}}\n")
    text = collect_once(HostRoots(), loaded.config.node_exporter, TABLE, ["textfile"]).decode()
    assert "site_rack_position 7" in text


def test_textfile_dir_and_textfile_directory_that_differ_are_an_error() -> None:
    found = issues("nodeExporter: {textfileDir: /a, textfileDirectory: /b}\n")
    assert list(found) == ["nodeExporter.textfileDir"] and "differ" in found["nodeExporter.textfileDir"]


def test_textfile_dir_of_the_wrong_type_is_an_error() -> None:
    assert list(issues("nodeExporter: {textfileDir: [a]}\n")) == ["nodeExporter.textfileDir"]


@pytest.mark.parametrize(
    ("node_exporter", "rootfs", "filesystem", "noted"),
    [
        ("{enabled: true, rootfsPath: /host/root}", "/host/root", True, False),
        ('{enabled: true, rootfsPath: ""}', "/", False, False),  # Go: no host root, no filesystem collector
        ('{enabled: true, rootfsPath: "", collectors: {filesystem: true}}', "/", True, False),  # explicit wins
        ("{enabled: true}", "/", True, True),  # absent: our rootfs, noted
        ("{enabled: false}", "/", False, False),  # the surface is off: nothing runs
    ],
)
def test_rootfs_path(node_exporter: str, rootfs: str, filesystem: bool, noted: bool) -> None:
    loaded = parse(f"nodeExporter: {node_exporter}\n")
    assert str(Agent(loaded).roots.rootfs) == rootfs  # where filesystem, os and udev data are read
    assert ("filesystem" in surface_names(loaded)) is filesystem
    assert len(notes_about(loaded, "nodeExporter.rootfsPath")) == (1 if noted else 0)


def test_rootfs_path_and_rootfs_that_differ_are_an_error() -> None:
    assert list(issues("rootfs: /a\nnodeExporter: {rootfsPath: /b}\n")) == ["nodeExporter.rootfsPath"]
    assert parse("rootfs: /a\nnodeExporter: {rootfsPath: /a}\n").config.rootfs == "/a"


@pytest.mark.parametrize(
    ("flags", "on", "off"),
    [
        ("[--no-collector.hwmon, --collector.filesystem]", {"filesystem", "cpu"}, {"hwmon"}),
        ("[--no-collector.cpu, --collector.cpu]", {"cpu"}, set()),  # later wins
        ("[--collector.disable-defaults, --collector.meminfo]", {"meminfo"}, set(DEFAULTS) - {"meminfo"}),
        ("[--collector.meminfo, --collector.disable-defaults]", {"meminfo"}, set(DEFAULTS) - {"meminfo"}),
        ("[--no-collector.arp, --no-collector.systemd]", set(DEFAULTS), set()),  # not ours: off anyway, noted
        ("[--collector.systemd]", set(DEFAULTS), set()),  # the Go chart's example: accepted, noted, not served
        ("[]", set(DEFAULTS), set()),
    ],
)
def test_extra_flags_turn_collectors_on_and_off(flags: str, on: set[str], off: set[str]) -> None:
    loaded = parse(f"nodeExporter: {{enabled: true, rootfsPath: /, extraFlags: {flags}}}\n")
    names = set(surface_names(loaded))
    assert on <= names and not (off & names)
    assert len(notes_about(loaded, "nodeExporter.extraFlags")) == flags.count("arp") + flags.count("systemd")


def test_extra_flags_set_the_filters_we_implement() -> None:
    flags = [
        "--collector.diskstats.device-exclude=^loop",
        "--collector.netdev.device-include=^eth",
        "--collector.filesystem.fs-types-exclude=^tmpfs$",
        "--collector.hwmon.chip-exclude=^acpi",
        "--collector.textfile.directory=/run/textfile",
    ]
    ne = parse(f"nodeExporter: {{enabled: true, extraFlags: {flags}}}\n").config.node_exporter
    assert ne.diskstats.device_exclude == "^loop"
    assert ne.netdev.device_include == "^eth"
    assert ne.filesystem.fs_types_exclude == "^tmpfs$"
    assert ne.hwmon.chip_exclude == "^acpi"
    assert ne.textfile_directory == "/run/textfile"


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--path.rootfs=/", "only --collector.* and --no-collector.*"),
        ("--web.listen-address=:9100", "only --collector.* and --no-collector.*"),
        ("-collector.cpu", "only --collector.* and --no-collector.*"),
        ("--collector.cpuu", "unknown node_exporter collector"),
        ("--no-collector.nosuch", "unknown node_exporter collector"),
        ("--collector.filesystem.mount-timeout=5s", "option flag not supported"),
        ("--collector.cpu=false", "option flag not supported"),
        ("--collector.diskstats.device-exclude=(", "not a valid regular expression"),
    ],
)
def test_extra_flags_we_cannot_honour_are_errors_at_their_key(flag: str, message: str) -> None:
    found = issues(f"nodeExporter: {{enabled: true, extraFlags: ['--collector.cpu', '{flag}']}}\n")
    (path,) = found
    assert path in ("nodeExporter.extraFlags[1]", "nodeExporter.diskstats.deviceExclude")
    assert message in found[path]


def test_extra_flags_that_contradict_the_config_are_errors() -> None:
    text = "nodeExporter: {diskstats: {deviceExclude: '^a'}, extraFlags: ['--collector.diskstats.device-exclude=^b']}"
    assert list(issues(text)) == ["nodeExporter.extraFlags[0]"]


# --- dcgmCompat / smartctlCompat ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["dcgmCompat", "smartctlCompat"])
def test_compat_toggles(key: str) -> None:
    attr = {"dcgmCompat": "dcgm_compat", "smartctlCompat": "smartctl_compat"}[key]
    assert getattr(parse("{}\n").config, attr).enabled is False
    assert getattr(parse(f"{key}: {{enabled: true}}\n").config, attr).enabled is True


# --- history ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("history", "enabled", "retention", "minutes", "metrics"),
    [
        ("{}", False, 1825, 5, set(DEFAULT_METRICS)),
        ("{enabled: true}", True, 1825, 5, set(DEFAULT_METRICS)),
        ("{enabled: true, retentionDays: 0, intervalMinutes: -1}", True, 1825, 5, set(DEFAULT_METRICS)),
        ("{enabled: true, retentionDays: 30, intervalMinutes: 10, metrics: [load1]}", True, 30, 10, {"load1"}),
    ],
)
def test_history_keys(
    tmp_path: Path, history: str, enabled: bool, retention: int, minutes: int, metrics: set[str]
) -> None:
    loaded = parse(f"stateDir: {tmp_path}\nhistory: {history}\n")
    h = loaded.config.history
    assert (h.enabled, h.retention_days, h.interval_minutes) == (enabled, retention, minutes)
    sink = HistorySink(Agent(loaded).sink_context())
    assert sink.windows.allow == frozenset(metrics)
    assert sink.windows.interval == minutes * 60
    assert len(notes_about(loaded, "history.retentionDays")) == (1 if "retentionDays: 0" in history else 0)


def test_history_lives_in_the_state_dir_without_data_dir(tmp_path: Path) -> None:
    loaded = parse(f"stateDir: {tmp_path}\nhistory: {{enabled: true}}\n")
    assert history_path(loaded.config.history, loaded.state_dir) == tmp_path / "history.db"
    assert len(notes_about(loaded, "history.dataDir")) == 1


async def test_history_database_is_written_in_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "var-lib-nodevitals-history"
    go_file = data_dir / "history.db"  # a Go agent's bbolt database from before the migration
    data_dir.mkdir()
    go_file.write_bytes(b"bbolt pages")
    agent = make_agent(tmp_path, history=f"{{enabled: true, dataDir: {data_dir}}}")
    sink = make_sink(agent, Wall(T0 + 400))
    async with serving(sink):
        sink.ingest(temps("gpu0", (40.0, T0 + 10)))
        assert await sink.flush() == 1
    assert sink.path.parent == data_dir
    assert sink.path.stat().st_size > 0
    assert not (tmp_path / "state" / "history.db").exists()
    assert go_file.read_bytes() == b"bbolt pages"  # left for a rollback, never opened as sqlite
    assert len(notes_about(agent.loaded, "history.dataDir")) == 1
