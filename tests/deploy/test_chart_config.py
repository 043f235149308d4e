"""The chart and the agent cannot drift apart: every rendered config passes `nvdaemon check-config` with the
environment its pod would have, and the chart offers no key the agent's config structs do not have."""

from __future__ import annotations

import base64
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
from nvdaemon.compat.node_exporter.options import DEFAULTS as NODE_EXPORTER_DEFAULTS
from tests.deploy import helm
from tests.deploy.helm import CHART, Doc, Rendered, agent, render
from tests.deploy.matrix import MATRIX, NODE_EXPORTER, TEXTFILE_DIR

pytestmark = pytest.mark.skipif(helm.helm_path() is None, reason="helm not found: run scripts/fetch-helm")

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
        [NVDAEMON, "check-config", str(path)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_rendered_config_passes_check_config(case: str, tmp_path: Path) -> None:
    rendered = render(MATRIX[case])
    jobs = []
    for component, ds in rendered.daemonsets().items():
        text, parsed = rendered.config_of(ds)
        path = tmp_path / f"{component}.yaml"
        path.write_text(text)
        jobs.append((component, path, pod_env(rendered, ds), parsed))
    assert jobs or case == "none"
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda job: check_config(job[1], job[2]), jobs))
    for (component, path, _, parsed), proc in zip(jobs, results, strict=True):
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


def test_default_rules_are_the_agents_embedded_ones() -> None:
    embedded = yaml.safe_load(resources.files("nvdaemon").joinpath("default.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["rules"] == embedded["rules"]
    assert values["intervalSeconds"] == embedded["intervalSeconds"]


def _fields(struct: type[msgspec.Struct]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(struct)}


def _props(schema: dict[str, Any], *path: str) -> set[str]:
    node = schema
    for key in path:
        node = node[key]
    if "$ref" in node:
        node = schema["definitions"][node["$ref"].rpartition("/")[2]]
    return set(node["properties"])


SCHEMA = json.loads((CHART / "values.schema.json").read_text())
CHART_ONLY = {"existingSecret"}  # webhooks[].existingSecret: rendered as an env reference, not a config key


@pytest.mark.parametrize(
    ("schema_path", "struct"),
    [
        (("properties", "smart"), agent_config.SmartConfig),
        (("properties", "gpu"), agent_config.GpuConfig),
        (("properties", "history"), agent_config.HistoryConfig),
        (("properties", "rules", "items"), agent_config.Rule),
        (("definitions", "rule", "properties", "nvsentinel"), agent_config.RuleNvsentinel),
        (("properties", "webhooks", "items"), agent_config.WebhookSink),
        (("properties", "nodeExporter"), agent_config.NodeExporterConfig),
        (("properties", "nodeExporter", "properties", "diskstats"), agent_config.NodeDiskstatsOptions),
        (("properties", "nodeExporter", "properties", "filesystem"), agent_config.NodeFilesystemOptions),
        (("properties", "nodeExporter", "properties", "netdev"), agent_config.NodeNetdevOptions),
        (("properties", "nodeExporter", "properties", "hwmon"), agent_config.NodeHwmonOptions),
    ],
)
def test_schema_offers_only_keys_the_agent_knows(schema_path: tuple[str, ...], struct: type[msgspec.Struct]) -> None:
    offered = _props(SCHEMA, *schema_path) - CHART_ONLY
    assert offered <= _fields(struct), f"{'.'.join(schema_path)}: the agent does not know {offered - _fields(struct)}"


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
    assert values["nodeExporter"] == {"enabled": False, "collectors": {}, "textfileDirectory": ""}


def test_node_exporter_config_is_read_by_the_agent_as_set() -> None:
    """What the agent makes of the rendered section: the values set, and the agent's own defaults for the rest."""
    rendered = render(NODE_EXPORTER)
    text, _ = rendered.config_of(rendered.daemonsets()["core"])
    loaded = agent_config.parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    assert loaded.rootfs == "/host/root"
    assert loaded.node_exporter == agent_config.NodeExporterConfig(
        enabled=True,
        collectors={"infiniband": False, "nvme": False, "hwmon": True},
        textfile_directory=TEXTFILE_DIR,
        netdev=agent_config.NodeNetdevOptions(device_exclude="^(veth|cali|lxc)"),
        diskstats=agent_config.NodeDiskstatsOptions(device_exclude=""),
        filesystem=agent_config.NodeFilesystemOptions(mount_timeout_seconds=3),
    )
    minimal = render({"nodeExporter": {"enabled": True}})
    text, _ = minimal.config_of(minimal.daemonsets()["core"])
    loaded = agent_config.parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    assert loaded.node_exporter == agent_config.NodeExporterConfig(enabled=True)  # every filter: node_exporter's
    text, _ = render().config_of(render().daemonsets()["core"])
    loaded = agent_config.parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    assert loaded.node_exporter == agent_config.NodeExporterConfig()
    assert loaded.rootfs == "/"
