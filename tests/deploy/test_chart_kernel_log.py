"""The chart's kernel log values (kernelLog.*): off by default with no new privilege, and when on exactly one pod per
node reads the host's /dev/kmsg at its config's <devRoot>/kmsg, as uid 0 with CAP_SYSLOG (privileged unless told
not), while every other pod's config says kernelLog.enabled false. Every rendered config is read by the agent's own
config loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from nvdaemon import config as agent_config
from nvdaemon import configload
from tests.deploy.helm import (
    CHART,
    Doc,
    Rendered,
    RenderError,
    agent,
    assert_valid_kubernetes,
    deep_merge,
    mounts,
    notes,
    pod_spec,
    render,
    run_helm,
)
from tests.deploy.matrix import ALL_TIERS, GO_VALUES
from tests.deploy.psa import baseline_violations
from tests.deploy.test_chart_config import SCHEMA, _drift, _node, check_rendered_configs

KMSG = "/host/dev/kmsg"
RULE: dict[str, Any] = {
    "pattern": r"NETDEV WATCHDOG: (?P<nic>\S+) \(\S+\): transmit queue \d+ timed out",
    "condition": "nic_tx_timeout",
    "severity": "warning",
    "mode": "condition",
    "device": "nic",
    "count": 3,
    "windowSeconds": 300,
    "clearAfterSeconds": 3600,
    "nvsentinel": {"checkName": "NicTxTimeout", "recommendedAction": "RESTART_BM"},
}
ON: dict[str, Any] = {"kernelLog": {"enabled": True}}


def with_kernel_log(values: dict[str, Any], **kernel_log: Any) -> dict[str, Any]:
    return deep_merge(values, {"kernelLog": {"enabled": True, **kernel_log}})


def loaded(rendered: Rendered, ds: Doc) -> agent_config.Config:
    """The DaemonSet's config as the agent reads it (what `nvdaemon run` would start with)."""
    text, _ = rendered.config_of(ds)
    return configload.parse_config(text, "chart", env={"NODE_NAME": "node-a"}).config


def added_capabilities(ds: Doc) -> list[str]:
    added: list[str] = (agent(ds)["securityContext"].get("capabilities") or {}).get("add", [])
    return added


def reads_kmsg(rendered: Rendered, ds: Doc) -> bool:
    """The pod can read the host's /dev/kmsg where its config says, and its config says to."""
    config = loaded(rendered, ds)
    if not config.kernel_log.enabled:
        return False
    m = mounts(ds)
    assert f"{config.dev_root}/kmsg" == KMSG
    if KMSG in m:
        assert m[KMSG]["volume"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    else:  # the smart tier's /dev already holds it: no second mount of the same device
        assert m[config.dev_root]["volume"]["hostPath"]["path"] == "/dev"
    return True


def readers(rendered: Rendered) -> set[str]:
    return {component for component, ds in rendered.daemonsets().items() if reads_kmsg(rendered, ds)}


def assert_not_a_reader(rendered: Rendered, ds: Doc) -> None:
    _, config = rendered.config_of(ds)
    assert config["kernelLog"] == {"enabled": False}, "a pod not meant to read /dev/kmsg would report it unreadable"
    assert "kernelRules" not in config
    assert "SYSLOG" not in added_capabilities(ds)
    assert KMSG not in mounts(ds)
    assert not any(v.get("hostPath", {}).get("path") == "/dev/kmsg" for v in pod_spec(ds)["volumes"])


def assert_reader(rendered: Rendered, ds: Doc, *, privileged: bool) -> None:
    ctx = agent(ds)["securityContext"]
    assert ctx["runAsUser"] == 0 and ctx["runAsNonRoot"] is False
    assert pod_spec(ds)["securityContext"]["runAsUser"] == 0
    assert "SYSLOG" in added_capabilities(ds) and ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx.get("privileged", False) is privileged
    assert ctx["readOnlyRootFilesystem"] is True
    assert reads_kmsg(rendered, ds)
    assert "initContainers" not in pod_spec(ds), "root owns the state directory already"


@pytest.mark.parametrize(
    "values",
    [{}, ALL_TIERS, {**ALL_TIERS, "singlePod": True}, yaml.safe_load(GO_VALUES.read_text())],
    ids=["defaults", "all-tiers", "single-pod", "go-values-file"],
)
def test_off_by_default_no_pod_reads_it_or_gets_a_privilege_for_it(values: dict[str, Any]) -> None:
    rendered = render(values)
    assert rendered.daemonsets()
    for ds in rendered.daemonsets().values():
        assert_not_a_reader(rendered, ds)
        assert loaded(rendered, ds).kernel_log.enabled is False
    assert readers(rendered) == set()
    assert "SYSLOG" not in rendered.text and "/dev/kmsg" not in rendered.text


def test_with_the_gpu_tier_only_the_gpu_pod_reads_it() -> None:
    rendered = render(with_kernel_log(ALL_TIERS, rules=[RULE]))
    dss = rendered.daemonsets()
    gpu = dss["gpu"]
    assert_reader(rendered, gpu, privileged=True)
    assert added_capabilities(gpu) == ["SYSLOG"]
    assert "allowPrivilegeEscalation" not in agent(gpu)["securityContext"], "the API server refuses it with privileged"
    assert baseline_violations(pod_spec(gpu)) == {"hostPathVolumes", "capabilities", "privileged"}
    _, config = rendered.config_of(gpu)
    assert config["kernelLog"] == {
        "enabled": True,
        "lookbackSeconds": 3600,
        "maxRecordsPerSecond": 2000,
        "defaultRules": True,
    }
    assert config["kernelRules"] == [RULE]
    agent_view = loaded(rendered, gpu)
    (rule,) = agent_view.kernel_rules
    assert (rule.condition, rule.mode, rule.device, rule.count) == ("nic_tx_timeout", "condition", "nic", 3)
    assert rule.nvsentinel is not None and rule.nvsentinel.recommended_action == "RESTART_BM"
    for component in ("core", "smart"):
        assert_not_a_reader(rendered, dss[component])
    assert agent(dss["smart"])["securityContext"].get("privileged") is None, "smart's own privilege is unchanged"
    for doc in rendered.docs:
        assert_valid_kubernetes(doc, "kernel log on gpu")


@pytest.mark.parametrize(
    ("values", "reader"),
    [
        (ON, "core"),
        ({**ON, "tiers": {"smart": {"enabled": True}}}, "smart"),
        ({**ON, "tiers": {"core": {"enabled": False}, "smart": {"enabled": True}}}, "smart"),
        (with_kernel_log(ALL_TIERS, pod="core"), "core"),
        (with_kernel_log(ALL_TIERS, pod="smart"), "smart"),
    ],
    ids=["auto-core", "auto-smart-over-core", "auto-smart-alone", "named-core", "named-smart"],
)
def test_auto_picks_gpu_then_smart_then_core_and_a_named_tier_wins(values: dict[str, Any], reader: str) -> None:
    rendered = render(values)
    assert readers(rendered) == {reader}
    assert_reader(rendered, rendered.daemonsets()[reader], privileged=True)
    for component, ds in rendered.daemonsets().items():
        if component != reader:
            assert_not_a_reader(rendered, ds)


def test_the_smart_pod_reads_it_through_its_own_dev_mount() -> None:
    rendered = render({**ON, "tiers": {"smart": {"enabled": True}}})
    smart = rendered.daemonsets()["smart"]
    assert added_capabilities(smart) == ["SYS_RAWIO", "SYS_ADMIN", "SYSLOG"]
    assert KMSG not in mounts(smart)
    assert [v["hostPath"]["path"] for v in pod_spec(smart)["volumes"] if "hostPath" in v].count("/dev") == 1
    assert loaded(rendered, smart).dev_root == "/host/dev"


@pytest.mark.parametrize("pod", ["smart", "gpu"])
@pytest.mark.parametrize("single_pod", [False, True])
def test_a_named_pod_whose_tier_is_off_fails_the_install(pod: str, single_pod: bool) -> None:
    with pytest.raises(RenderError, match=f"kernelLog.pod is {pod}, but tiers.{pod}.enabled is false"):
        render(with_kernel_log({"singlePod": single_pod}, pod=pod))
    render({"kernelLog": {"enabled": False, "pod": pod}})  # nothing reads it: nothing to refuse


def test_not_privileged_keeps_uid_0_and_syslog_only() -> None:
    rendered = render(with_kernel_log(ALL_TIERS, privileged=False))
    gpu = rendered.daemonsets()["gpu"]
    assert_reader(rendered, gpu, privileged=False)
    ctx = agent(gpu)["securityContext"]
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert ctx["allowPrivilegeEscalation"] is False
    assert baseline_violations(pod_spec(gpu)) == {"hostPathVolumes", "capabilities"}
    smart = render(with_kernel_log({"tiers": {"smart": {"enabled": True}}}, privileged=False)).daemonsets()["smart"]
    assert "privileged" not in agent(smart)["securityContext"]


@pytest.mark.parametrize("tiers", [ALL_TIERS, {}], ids=["every-tier", "core-only"])
def test_single_pod_reads_it_whatever_pod_says(tiers: dict[str, Any]) -> None:
    rendered = render(with_kernel_log({**tiers, "singlePod": True}, pod="core" if tiers else "auto"))
    assert readers(rendered) == {"agent"}
    pod = rendered.daemonsets()["agent"]
    assert_reader(rendered, pod, privileged=True)
    expected = ["SYS_RAWIO", "SYS_ADMIN", "SYSLOG"] if tiers else ["SYSLOG"]
    assert added_capabilities(pod) == expected
    assert (KMSG in mounts(pod)) is not bool(tiers), "a second mount only where the host's /dev is not mounted"


def test_the_rendered_configs_pass_check_config(tmp_path: Path) -> None:
    rendered = render(with_kernel_log(ALL_TIERS, rules=[RULE], maxRecordBytes=4096, xidRepeatSeconds=600))
    checked = check_rendered_configs(rendered, tmp_path)
    assert {component for component, *_ in checked} == {"core", "smart", "gpu"}
    for component, _, parsed, proc in checked:
        assert proc.returncode == 0, f"{component}: the agent rejects the chart's config:\n{proc.stderr}"
        assert parsed["kernelLog"]["enabled"] is (component == "gpu")
    gpu = loaded(rendered, rendered.daemonsets()["gpu"]).kernel_log
    assert (gpu.max_record_bytes, gpu.xid_repeat_seconds, gpu.xid_merge_seconds) == (4096, 600, 2.0)


def test_helm_lint_strict(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(with_kernel_log(ALL_TIERS, rules=[RULE], privileged=False)))
    proc = run_helm("lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_turning_it_on_rolls_only_the_reader() -> None:
    def config_sums(rendered: Rendered) -> dict[str, str]:
        return {
            c: ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for c, ds in rendered.daemonsets().items()
        }

    before, after = config_sums(render(ALL_TIERS)), config_sums(render(with_kernel_log(ALL_TIERS)))
    assert {c for c in before if before[c] != after[c]} == {"gpu"}


@pytest.mark.parametrize(
    "bad",
    [
        {"kernelLog": {"enabeld": True}},
        {"kernelLog": {"enabled": True, "pod": "nvml"}},
        {"kernelLog": {"enabled": True, "privileged": "yes"}},
        {"kernelLog": {"enabled": True, "maxRecordsPerSecond": 0}},
        {"kernelLog": {"enabled": True, "lookbackSeconds": -1}},
        {"kernelLog": {"enabled": True, "rules": [{**RULE, "severty": "info"}]}},
        {"kernelLog": {"enabled": True, "rules": [{"pattern": "x"}]}},
        {"kernelLog": {"enabled": True, "rules": [{**RULE, "mode": "events"}]}},
        {"kernelLog": {"enabled": True, "rules": [{**RULE, "nvsentinel": {"checkNam": "X"}}]}},
        {"kernelLog": {"enabled": True, "rules": [{**RULE, "windowSeconds": 0}]}},
    ],
)
def test_values_schema_rejects_typos(bad: dict[str, Any]) -> None:
    with pytest.raises(RenderError, match="values don't meet the specifications of the schema"):
        render(bad)


def test_schema_and_defaults_agree_with_the_agent() -> None:
    """The chart offers the agent's keys with the agent's bounds (pod, privileged and rules are the chart's own), and
    its defaults are the agent's."""
    kernel_log = _node(SCHEMA, "properties", "kernelLog")
    offered = set(kernel_log["properties"]) - {"pod", "privileged", "rules"}
    assert offered <= {f.encode_name for f in msgspec.structs.fields(agent_config.KernelLogConfig)}
    assert _drift(kernel_log, agent_config.KernelLogConfig, offered) == []
    rule = _node(SCHEMA, "properties", "kernelLog", "properties", "rules", "items")
    assert _drift(rule, agent_config.KernelRule, set(rule["properties"])) == []
    assert set(rule["properties"]) == {f.encode_name for f in msgspec.structs.fields(agent_config.KernelRule)}
    overrides = _node(SCHEMA, "definitions", "kernelRule", "properties", "nvsentinel")
    assert _drift(overrides, agent_config.RuleNvsentinel, set(overrides["properties"])) == []
    values = yaml.safe_load((CHART / "values.yaml").read_text())["kernelLog"]
    assert values == {
        "enabled": False,
        "pod": "auto",
        "privileged": True,
        "lookbackSeconds": 3600,
        "maxRecordsPerSecond": 2000,
        "defaultRules": True,
        "rules": [],
    }
    defaults = agent_config.KernelLogConfig()
    assert (defaults.lookback_seconds, defaults.max_records_per_second, defaults.default_rules) == (3600, 2000, True)


def test_notes_name_the_reader_and_its_privilege(tmp_path: Path) -> None:
    text = notes(tmp_path, with_kernel_log(ALL_TIERS))
    assert "Kernel log: DaemonSet nv-nvdaemon-gpu (tiers: gpu) reads the host's /dev/kmsg" in text
    assert "kernel log: nv-nvdaemon-gpu reads the host's /dev/kmsg as uid 0 with CAP_SYSLOG, privileged" in text
    assert "It runs privileged" in text
    assert "The namespace must be privileged" in text and "nodevitals_kmsg_up" in text
    unprivileged = notes(tmp_path / "unprivileged", with_kernel_log({}, privileged=False))
    assert "DaemonSet nv-nvdaemon-core (tiers: core) reads the host's /dev/kmsg" in unprivileged
    assert "It is not privileged (kernelLog.privileged=false)" in unprivileged
    assert "It is the only one" not in unprivileged, "one DaemonSet: no other to speak of"
    off = notes(tmp_path / "off", ALL_TIERS)
    assert "/dev/kmsg" not in off and "CAP_SYSLOG" not in off
