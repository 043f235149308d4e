"""The chart and the agent cannot drift apart: every rendered config passes `nvdaemon check-config` with the
environment its pod would have, and the chart offers no key the agent's config structs do not have."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from nvdaemon import config as agent_config
from nvdaemon import configload
from nvdaemon.compat.node_exporter.options import DEFAULTS as NODE_EXPORTER_DEFAULTS
from tests.deploy.helm import CHART, Doc, Rendered, agent, render
from tests.deploy.matrix import GO_VALUES, MATRIX, NODE_EXPORTER, TEXTFILE_DIR

NVDAEMON = str(Path(sys.executable).parent / "nvdaemon")
EXTERNAL_SECRET = "whsec_" + base64.b64encode(b"a secret from a Secret we did not render").decode()


def pod_env(rendered: Rendered, ds: Doc) -> dict[str, str]:
    """The environment the agent container gets: fieldRefs as a scheduled pod would see them, secretKeyRefs from the
    rendered Secret (or a stand-in for a Secret the operator manages)."""
    env: dict[str, str] = {}
    secrets = rendered.secret_data()
    for entry in agent(ds).get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        source = entry["valueFrom"]
        if "fieldRef" in source:
            env[entry["name"]] = {"spec.nodeName": "node-a"}[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["secretKeyRef"]
            env[entry["name"]] = secrets.get(f"{ref['name']}/{ref['key']}", EXTERNAL_SECRET)
    return env


def check_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(path.parent)}
    return subprocess.run(
        [NVDAEMON, "check-config", "--offline", str(path)],  # the token files are the pod's, not this host's
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def check_rendered_configs(
    rendered: Rendered, tmp_path: Path
) -> list[tuple[str, Path, dict[str, Any], subprocess.CompletedProcess[str]]]:
    """``check-config`` of every DaemonSet's config, in the environment of its pod, run in parallel:
    (component, config file, parsed config, result) per DaemonSet."""
    jobs = []
    for component, ds in rendered.daemonsets().items():
        text, parsed = rendered.config_of(ds)
        path = tmp_path / f"{component}.yaml"
        path.write_text(text)
        jobs.append((component, path, pod_env(rendered, ds), parsed))
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda job: check_config(job[1], job[2]), jobs))
    return [(component, path, parsed, proc) for (component, path, _, parsed), proc in zip(jobs, results, strict=True)]


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_rendered_config_passes_check_config(case: str, tmp_path: Path) -> None:
    checked = check_rendered_configs(render(MATRIX[case]), tmp_path)
    assert checked, f"{case}: renders no DaemonSet"
    for component, path, parsed, proc in checked:
        assert proc.returncode == 0, f"{case}/{component}: the agent rejects the chart's config:\n{proc.stderr}"
        tiers = ",".join(parsed["tiers"])
        assert f"{path}: ok (node node-a, tiers {tiers}, {len(parsed.get('rules', []))} rule(s))" in proc.stdout


def test_check_config_catches_drift(tmp_path: Path) -> None:
    """The check above is not vacuous: a key the agent does not know, or a secret variable the pod lacks, fails it."""
    rendered = render({"extraConfig": {"smart": {"intervalSecs": 60}}})
    ds = rendered.daemonsets()["core"]
    path = tmp_path / "c.yaml"
    path.write_text(rendered.config_of(ds)[0])
    proc = check_config(path, pod_env(rendered, ds))
    assert proc.returncode == 2
    assert "smart.intervalSecs" in proc.stderr
    hooks = render(MATRIX["webhooks"])
    ds = hooks.daemonsets()["core"]
    path.write_text(hooks.config_of(ds)[0])
    env = pod_env(hooks, ds)
    del env["WEBHOOK_SECRET_1"]
    proc = check_config(path, env)
    assert proc.returncode == 2
    assert "WEBHOOK_SECRET_1" in proc.stderr


def test_default_rules_are_the_go_charts() -> None:
    """rules, smartRules and gpuRules default to the Go chart's (contract §5): a default install raises the events a
    Go install raised. The interval is the agent's embedded one."""
    embedded = yaml.safe_load(resources.files("nvdaemon").joinpath("default.yaml").read_text())
    go = yaml.safe_load(GO_VALUES.read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in ("rules", "smartRules", "gpuRules"):
        assert values[key] == go[key], key
    assert [r["metric"] for r in values["rules"]] == ["load1"]
    assert [r["metric"] for r in values["gpuRules"]] == ["gpu_temperature_celsius", "gpu_ecc_uncorrected_total"]
    assert len(values["smartRules"]) == 5
    assert values["intervalSeconds"] == embedded["intervalSeconds"] == go["intervalSeconds"]


def _fields(struct: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(struct)}


def _node(schema: dict[str, Any], *path: str) -> dict[str, Any]:
    node = schema
    for key in path:
        node = node[key]
    if "$ref" in node:
        node = schema["definitions"][node["$ref"].rpartition("/")[2]]
    return node


SCHEMA = json.loads((CHART / "values.schema.json").read_text())
_JSON_TYPES: dict[type[msgspec.inspect.Type], str] = {
    msgspec.inspect.StrType: "string",
    msgspec.inspect.BoolType: "boolean",
    msgspec.inspect.IntType: "integer",
    msgspec.inspect.FloatType: "number",
    msgspec.inspect.LiteralType: "string",
    msgspec.inspect.ListType: "array",
    msgspec.inspect.DictType: "object",
    msgspec.inspect.StructType: "object",
}


def _drift(node: dict[str, Any], struct: type[msgspec.Struct], keys: set[str]) -> list[str]:
    """How the schema's properties ``keys`` of ``node`` disagree with the agent's fields of the same names: a JSON type
    other than the field's, values the field's Literal does not allow, a bound other than its ge/gt, or a field the
    agent requires that the schema does not. Empty when the chart accepts what the agent accepts (enums may be
    narrower: gpu.backend leaves out the test-only fake)."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    fields = {f.encode_name: f for f in info.fields}
    problems = []
    for key in sorted(keys):
        prop, field_type = node["properties"][key], fields[key].type
        optional = False
        if isinstance(field_type, msgspec.inspect.UnionType):  # X | None: the schema offers X, or X and null
            optional = True
            (field_type,) = [t for t in field_type.types if not isinstance(t, msgspec.inspect.NoneType)]
        if isinstance(field_type, msgspec.inspect.Metadata):  # a path key (config.FilePath): a string to the schema
            field_type = field_type.type
        json_type = _JSON_TYPES[type(field_type)]
        if "$ref" not in prop and prop.get("type") not in (json_type, [json_type, "null"] if optional else json_type):
            problems.append(f"{key}: type {prop.get('type')}, the agent's {json_type}")
        value_type = field_type.value_type if isinstance(field_type, msgspec.inspect.DictType) else None
        for schema_value, agent_type in ((prop, field_type), (prop.get("additionalProperties"), value_type)):
            if isinstance(agent_type, msgspec.inspect.LiteralType):
                enum = (schema_value or {}).get("enum")
                if enum is None or not set(enum) <= set(agent_type.values):
                    problems.append(f"{key}: enum {enum}, the agent's {sorted(map(str, agent_type.values))}")
        if isinstance(field_type, msgspec.inspect.IntType | msgspec.inspect.FloatType):
            bounds = (prop.get("minimum"), prop.get("exclusiveMinimum"))
            if bounds != (field_type.ge, field_type.gt):
                problems.append(
                    f"{key}: minimum/exclusiveMinimum {bounds}, the agent's ge/gt {field_type.ge, field_type.gt}"
                )
    required = {f.encode_name for f in info.fields if f.required} - set(node.get("required", []))
    problems += [f"{key}: required by the agent, optional in the schema" for key in sorted(required)]
    return problems


# A values section, the agent's config struct it is rendered into, and its chart-only keys (rendered into the pod
# spec, not the config: a Secret reference, the socket's host directory, the projected token).
SECTIONS: list[tuple[tuple[str, ...], type[msgspec.Struct], set[str]]] = [
    (("properties", "smart"), agent_config.SmartConfig, set()),
    (("properties", "gpu"), agent_config.GpuConfig, set()),
    (("properties", "history"), agent_config.HistoryConfig, {"hostPath", "mountPath", "chownImage"}),
    (("properties", "rules", "items"), agent_config.Rule, set()),
    (("definitions", "rule", "properties", "nvsentinel"), agent_config.RuleNvsentinel, set()),
    (("properties", "webhooks", "items"), agent_config.WebhookSink, {"existingSecret"}),
    (
        ("properties", "nvsentinel"),
        agent_config.NvsentinelSink,
        {"socketHostPath", "socketName", "tokenAudience", "tokenExpirationSeconds", "resources"},
    ),
    (("properties", "nodeExporter"), agent_config.NodeExporterConfig, {"mountRootFS", "mountUdev", "mountSystemd"}),
    (("properties", "nodeExporter", "properties", "diskstats"), agent_config.NodeDiskstatsOptions, set()),
    (("properties", "nodeExporter", "properties", "filesystem"), agent_config.NodeFilesystemOptions, set()),
    (("properties", "nodeExporter", "properties", "netdev"), agent_config.NodeNetdevOptions, set()),
    (("properties", "nodeExporter", "properties", "hwmon"), agent_config.NodeHwmonOptions, set()),
    (
        ("properties", "dcgmCompat"),
        agent_config.DcgmCompatConfig,
        {"podResourcesHostPath", "podResourcesGroup", "podResourcesSeLinuxType"},
    ),
    (("properties", "smartctlCompat"), agent_config.Toggle, set()),
]


@pytest.mark.parametrize(("schema_path", "struct", "chart_only"), SECTIONS, ids=[".".join(s[0]) for s in SECTIONS])
def test_schema_offers_only_keys_the_agent_knows(
    schema_path: tuple[str, ...], struct: type[msgspec.Struct], chart_only: set[str]
) -> None:
    node = _node(SCHEMA, *schema_path)
    offered = set(node["properties"]) - chart_only
    assert offered <= _fields(struct), f"{'.'.join(schema_path)}: the agent does not know {offered - _fields(struct)}"
    assert chart_only <= set(node["properties"]), "a chart-only key the schema no longer has"
    assert _drift(node, struct, offered) == []


def test_schema_top_level_agent_keys_match_the_agent() -> None:
    """The top-level values copied into the config as they are (the rest of the top level is the chart's own)."""
    assert _drift(SCHEMA, agent_config.Config, {"intervalSeconds", "shutdownGraceSeconds"}) == []


def test_drift_check_is_not_vacuous() -> None:
    """A schema that lets through what the agent rejects, or rejects what it accepts, fails the check above."""
    bad = copy.deepcopy(SCHEMA)
    smart = bad["properties"]["smart"]["properties"]
    smart["maxConcurrent"].pop("minimum")  # 0 passes helm, fails the agent
    smart["intervalSeconds"]["type"] = "integer"  # 7.5 fails helm, passes the agent
    rule = bad["definitions"]["rule"]
    rule["properties"]["severity"]["enum"].append("fatal")
    rule["required"].remove("metric")
    problems = _drift(_node(bad, "properties", "smart"), agent_config.SmartConfig, {"maxConcurrent", "intervalSeconds"})
    assert [p.partition(":")[0] for p in problems] == ["intervalSeconds", "maxConcurrent"]
    problems = _drift(_node(bad, "definitions", "rule"), agent_config.Rule, {"severity"})
    assert [p.partition(":")[0] for p in problems] == ["severity", "metric"]


def test_values_sections_rendered_as_they_are_are_config_keys() -> None:
    """smart, gpu, history, nodeExporter, dcgmCompat, smartctlCompat are copied into the config under these names."""
    top = _fields(agent_config.Config)
    for key in ("smart", "gpu", "history", "nodeExporter", "dcgmCompat", "smartctlCompat", "intervalSeconds", "rules"):
        assert key in top
        assert key in SCHEMA["properties"]


def test_schema_offers_exactly_the_agents_node_exporter_collectors() -> None:
    """A misspelt collector fails `helm install`, not only the agent's start; every agent collector is offered."""
    collectors = SCHEMA["properties"]["nodeExporter"]["properties"]["collectors"]
    assert set(collectors["propertyNames"]["enum"]) == set(NODE_EXPORTER_DEFAULTS)
    assert collectors["additionalProperties"] == {"type": "boolean"}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["nodeExporter"] == {
        "enabled": False,
        "mountRootFS": True,  # the Go chart's keys and defaults
        "textfileDir": TEXTFILE_DIR,
        "mountUdev": True,
        "mountSystemd": False,
        "extraFlags": [],
        "collectors": {},
    }


def test_node_exporter_config_is_read_by_the_agent_as_set() -> None:
    """What the agent makes of the rendered section: the values set, and the agent's own defaults for the rest."""
    rendered = render(NODE_EXPORTER)
    text, _ = rendered.config_of(rendered.daemonsets()["core"])
    loaded = configload.parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    assert loaded.rootfs == "/host/root"
    assert loaded.node_exporter == agent_config.NodeExporterConfig(
        enabled=True,
        collectors={"infiniband": False, "nvme": False, "hwmon": True},
        textfile_directory=TEXTFILE_DIR,
        rootfs_path="/host/root",
        netdev=agent_config.NodeNetdevOptions(device_exclude="^(veth|cali|lxc)"),
        diskstats=agent_config.NodeDiskstatsOptions(device_exclude=""),
        filesystem=agent_config.NodeFilesystemOptions(mount_timeout_seconds=3),
    )
    minimal = render({"nodeExporter": {"enabled": True, "textfileDir": ""}})
    text, _ = minimal.config_of(minimal.daemonsets()["core"])
    loaded = configload.parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    # every filter: node_exporter's
    assert loaded.node_exporter == agent_config.NodeExporterConfig(enabled=True, rootfs_path="/host/root")
    assert loaded.rootfs == "/host/root"
    go_default = render({"nodeExporter": {"enabled": True}})  # the Go chart's default textfile directory
    text, _ = go_default.config_of(go_default.daemonsets()["core"])
    loaded = configload.parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    assert loaded.node_exporter == agent_config.NodeExporterConfig(
        enabled=True, textfile_directory=TEXTFILE_DIR, rootfs_path="/host/root"
    )
    text, _ = render().config_of(render().daemonsets()["core"])
    loaded = configload.parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    assert loaded.node_exporter == agent_config.NodeExporterConfig()
    assert loaded.rootfs == "/"
