"""The Helm chart, rendered by a real helm: lint, Kubernetes schemas, tiers, security, secrets, mounts, checksums."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy import helm
from tests.deploy.helm import CHART, NAMESPACE, Rendered, agent, deep_merge, mounts, notes, pod_spec, render
from tests.deploy.matrix import (
    ALL_TIERS,
    EXISTING_SECRET,
    HISTORY,
    MATRIX,
    NODE_EXPORTER,
    NVSENTINEL,
    SECRET_A,
    SECRET_B,
    TEXTFILE_DIR,
    WEBHOOKS,
)
from tests.deploy.psa import baseline_violations, restricted_violations

MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}  # CRDs: not in kubernetes-validate's bundled schemas


@pytest.mark.parametrize(
    "case",
    ["defaults", "everything", "single-pod-everything", "existing-secret", "node-exporter", "node-exporter-single-pod"],
)
def test_helm_lint_strict(case: str, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(MATRIX[case]))
    proc = helm.run_helm("lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_helm_lint_strict_fails_on_an_unknown_key(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps({"singlepod": True}))
    proc = helm.run_helm("lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode != 0
    assert "singlepod" in proc.stdout + proc.stderr


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_every_manifest_is_valid_kubernetes(case: str) -> None:
    rendered = render(MATRIX[case])
    assert rendered.kind("DaemonSet"), f"{case}: renders no DaemonSet"
    for doc in rendered.docs:
        name = f"{case}: {doc['kind']}/{doc['metadata']['name']}"
        assert doc["metadata"].get("namespace", NAMESPACE) == NAMESPACE, name
        labels = doc["metadata"]["labels"]
        for key in ("name", "instance", "version", "managed-by", "part-of"):
            assert f"app.kubernetes.io/{key}" in labels, f"{name}: no app.kubernetes.io/{key}"
        assert doc["metadata"]["name"].startswith(f"{helm.RELEASE}-"), f"{name}: not release-prefixed"
        if doc["kind"] in MONITORING_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1", name
            continue
        helm.assert_valid_kubernetes(doc, case)


def test_the_validator_rejects_what_it_should() -> None:
    """The validation above is not vacuous: a misspelt field in a rendered DaemonSet fails it."""
    ds = copy.deepcopy(render().daemonsets()["core"])
    agent(ds)["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, helm.KUBERNETES_VERSION, strict=True)


def test_kubernetes_validate_cli_strict(tmp_path: Path) -> None:
    """The command line the issue names, over one whole render (every kind it has schemas for)."""
    exe = shutil.which("kubernetes-validate") or str(Path(sys.executable).parent / "kubernetes-validate")
    docs = [d for d in render(MATRIX["everything"]).docs if d["kind"] not in MONITORING_KINDS]
    out = tmp_path / "all.yaml"
    out.write_text(yaml.safe_dump_all(docs))
    proc = subprocess.run(
        [exe, "--strict", "-k", helm.KUBERNETES_VERSION, "--quiet", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {"core": ["core"]}),
        (ALL_TIERS, {"core": ["core"], "smart": ["smart"], "gpu": ["gpu"]}),
        ({**ALL_TIERS, "singlePod": True}, {"agent": ["core", "smart", "gpu"]}),
        ({"tiers": {"core": {"enabled": False}, "gpu": {"enabled": True}}}, {"gpu": ["gpu"]}),
        ({"tiers": {"core": {"enabled": False}}}, {}),
    ],
)
def test_one_daemonset_per_tier_or_one_with_single_pod(values: dict[str, Any], expected: dict[str, list[str]]) -> None:
    rendered = render(values)
    dss = rendered.daemonsets()
    assert {c: rendered.config_of(ds)[1]["tiers"] for c, ds in dss.items()} == expected
    assert len(rendered.kind("DaemonSet")) == len(expected)
    assert len(rendered.kind("ConfigMap")) == len(expected)
    selectors = [json.dumps(ds["spec"]["selector"], sort_keys=True) for ds in dss.values()]
    assert len(set(selectors)) == len(selectors), "two DaemonSets must never select each other's pods"
    for ds in dss.values():
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()


def _without_init(spec: dict[str, Any]) -> dict[str, Any]:
    """The pod spec less its init containers (the state directory's chown, root with CAP_CHOWN alone)."""
    return {k: v for k, v in spec.items() if k != "initContainers"}


def test_core_is_restricted_except_for_the_host_it_reads() -> None:
    core = render().daemonsets()["core"]
    ctx = agent(core)["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == ctx["runAsGroup"] == 65532
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    spec = pod_spec(core)
    assert spec["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "runAsNonRoot": True,
    }
    # Baseline: only the host's /proc, /sys (+ state) and the host network (NIC counters are per netns).
    assert baseline_violations(spec) == {"hostPathVolumes", "hostNamespaces"}
    # Restricted, in addition: only the chown init container (root with CAP_CHOWN alone).
    assert restricted_violations(_without_init(spec)) == {"hostPathVolumes", "hostNamespaces", "volumeTypes"}
    (init,) = spec["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["command"] == ["chown", "65532:65532", "/var/lib/nvdaemon"]
    no_host_net = render({"tiers": {"core": {"hostNetwork": False}}}).daemonsets()["core"]
    assert baseline_violations(pod_spec(no_host_net)) == {"hostPathVolumes"}


@pytest.mark.parametrize("privileged", [False, True])
def test_smart_is_root_with_rawio_and_admin_and_privileged_only_when_set(privileged: bool) -> None:
    smart = render({"tiers": {"smart": {"enabled": True, "privileged": privileged}}}).daemonsets()["smart"]
    ctx = agent(smart)["securityContext"]
    assert ctx["runAsUser"] == 0
    assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["SYS_RAWIO", "SYS_ADMIN"]}
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx.get("privileged", False) is privileged
    spec = pod_spec(smart)
    assert "initContainers" not in spec, "root owns the state directory already"
    expected = {"hostPathVolumes", "capabilities"} | ({"privileged"} if privileged else set())
    assert baseline_violations(spec) == expected
    assert mounts(smart)["/host/dev"]["volume"]["hostPath"]["path"] == "/dev"
    assert {"/host/proc", "/host/sys"} <= set(mounts(smart)), "the smart tier reads the host's /proc and /sys too"


def test_gpu_has_runtime_class_gpu_nodes_and_no_host_path() -> None:
    rendered = render(MATRIX["gpu-only-no-hostpath"])
    gpu = rendered.daemonsets()["gpu"]
    spec = pod_spec(gpu)
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert not any("hostPath" in v for v in spec["volumes"])
    assert "hostNetwork" not in spec
    # Nothing of the host: the pod meets even Restricted.
    assert restricted_violations(spec) == set()
    # With the default stateDir on the node, the state directory is its only hostPath.
    default_gpu = render(ALL_TIERS).daemonsets()["gpu"]
    host_paths = [v["hostPath"]["path"] for v in pod_spec(default_gpu)["volumes"] if "hostPath" in v]
    assert host_paths == ["/var/lib/nvdaemon/gpu"]
    assert restricted_violations(_without_init(pod_spec(default_gpu))) == {"hostPathVolumes", "volumeTypes"}
    assert baseline_violations(pod_spec(default_gpu)) == {"hostPathVolumes"}
    assert render(ALL_TIERS).daemonsets()["core"]["spec"]["template"]["spec"].get("runtimeClassName") is None


def test_single_pod_takes_the_union_of_the_privileges() -> None:
    pod = render({**ALL_TIERS, "singlePod": True}).daemonsets()["agent"]
    spec = pod_spec(pod)
    assert agent(pod)["securityContext"]["runAsUser"] == 0
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["hostNetwork"] is True
    assert {"/host/proc", "/host/sys", "/host/dev"} <= set(mounts(pod))
    core_only = render({"singlePod": True}).daemonsets()["agent"]
    assert agent(core_only)["securityContext"]["runAsNonRoot"] is True
    assert "runtimeClassName" not in pod_spec(core_only)


@pytest.mark.parametrize("case", ["webhooks", "everything", "single-pod-everything"])
def test_webhook_secrets_only_in_the_secret(case: str) -> None:
    rendered = render(MATRIX[case])
    assert sorted(rendered.secret_data().values()) == sorted([SECRET_A, SECRET_B])
    raw_forms = {SECRET_A, SECRET_B, SECRET_A.removeprefix("whsec_"), SECRET_B.removeprefix("whsec_")}
    b64_forms = {base64.b64encode(s.encode()).decode() for s in (SECRET_A, SECRET_B)}
    for doc in rendered.docs:
        if doc["kind"] == "Secret":
            continue
        text = yaml.safe_dump(doc)
        for form in raw_forms | b64_forms:
            assert form not in text, f"{doc['kind']}/{doc['metadata']['name']} holds a webhook secret"
    for ds in rendered.kind("DaemonSet"):
        _, config = rendered.config_of(ds)
        hooks = config["sinks"]["webhook"]
        assert [h["url"] for h in hooks] == [h["url"] for h in WEBHOOKS["webhooks"]]
        assert [h.get("secret") for h in hooks] == ["${WEBHOOK_SECRET_0}", "${WEBHOOK_SECRET_1}", None]
        env = {e["name"]: e for e in agent(ds)["env"]}
        for i in (0, 1):
            ref = env[f"WEBHOOK_SECRET_{i}"]["valueFrom"]["secretKeyRef"]
            assert rendered.secret_data()[f"{ref['name']}/{ref['key']}"] == (SECRET_A, SECRET_B)[i]
        assert "WEBHOOK_SECRET_2" not in env


def test_existing_secret_is_referenced_and_no_secret_rendered() -> None:
    rendered = render(EXISTING_SECRET)
    assert rendered.kind("Secret") == []
    ds = rendered.daemonsets()["core"]
    env = {e["name"]: e for e in agent(ds)["env"]}
    assert env["WEBHOOK_SECRET_0"]["valueFrom"]["secretKeyRef"] == {"name": "hooks", "key": "hmac"}
    _, config = rendered.config_of(ds)
    assert config["sinks"]["webhook"][0]["secret"] == "${WEBHOOK_SECRET_0}"
    token = mounts(ds)["/var/run/secrets/nvdaemon/api-token"]
    assert token["volume"]["secret"] == {"secretName": "nvdaemon-api", "items": [{"key": "token", "path": "token"}]}
    assert config["server"]["apiTokenFile"] == "/var/run/secrets/nvdaemon/api-token/token"


def test_nvsentinel_socket_and_token_projection() -> None:
    rendered = render(MATRIX["nvsentinel"])
    for tier, ds in rendered.daemonsets().items():
        _, config = rendered.config_of(ds)
        nv = config["sinks"]["nvsentinel"]
        assert nv["enabled"] is True
        assert nv["processingStrategy"] == "STORE_ONLY"
        m = mounts(ds)
        socket_dir = str(Path(nv["socketPath"]).parent)
        assert socket_dir == "/var/run/nvsentinel", tier
        assert m[socket_dir]["volume"]["hostPath"] == {"path": "/var/run/nvsentinel", "type": "DirectoryOrCreate"}
        token_dir = str(Path(nv["tokenPath"]).parent)
        assert token_dir == "/var/run/secrets/nvsentinel/platform-connector"
        assert m[token_dir]["readOnly"] is True
        (source,) = m[token_dir]["volume"]["projected"]["sources"]
        assert source["serviceAccountToken"] == {
            "audience": "platform-connector.nvsentinel.nvidia.com",
            "expirationSeconds": 3600,
            "path": Path(nv["tokenPath"]).name,
        }
        assert pod_spec(ds)["automountServiceAccountToken"] is False, "only the audience-bound token is mounted"
    off = render(ALL_TIERS)
    for ds in off.daemonsets().values():
        assert "/var/run/nvsentinel" not in mounts(ds)
        assert "nvsentinel" not in off.config_of(ds)[1]["sinks"]


@pytest.mark.parametrize("case", sorted(MATRIX))
def test_mounts_match_the_paths_the_config_names(case: str) -> None:
    """Every path in the rendered config is where the pod mounts it: no config the pod cannot satisfy."""
    rendered = render(MATRIX[case])
    assert rendered.daemonsets(), f"{case}: renders no DaemonSet"
    for component, ds in rendered.daemonsets().items():
        _, config = rendered.config_of(ds)
        m = mounts(ds)
        container = agent(ds)
        assert container["args"][:3] == ["run", "--config", "/etc/nvdaemon/config.yaml"]
        assert m["/etc/nvdaemon"]["volume"]["configMap"]["name"] == ds["metadata"]["name"]
        assert m["/etc/nvdaemon"]["readOnly"] is True
        assert config["stateDir"] in m
        state = m[config["stateDir"]]["volume"]
        if MATRIX[case].get("stateDir", {}).get("enabled", True):
            assert state["hostPath"] == {
                "path": f"/var/lib/nvdaemon/{component.replace('agent', 'all')}",
                "type": "DirectoryOrCreate",
            }
        else:
            assert state == {"name": "state", "emptyDir": {}}
        for key, host in (("procRoot", "/proc"), ("sysRoot", "/sys"), ("devRoot", "/dev")):
            if key in config:
                assert m[config[key]]["volume"]["hostPath"]["path"] == host
                assert m[config[key]]["readOnly"] is True
        rootfs = config.get("nodeExporter", {}).get("rootfsPath")
        if rootfs:  # the node_exporter drop-in's host root
            assert m[rootfs]["volume"]["hostPath"] == {"path": "/", "type": "Directory"}
            assert m[rootfs]["readOnly"] is True
            assert m[rootfs]["mountPropagation"] == "HostToContainer"
        textfile = config.get("nodeExporter", {}).get("textfileDirectory")
        if textfile:
            assert m[textfile]["volume"]["hostPath"] == {"path": textfile, "type": "DirectoryOrCreate"}
            assert m[textfile]["readOnly"] is True
        if agent(ds)["securityContext"].get("readOnlyRootFilesystem"):
            assert "/tmp" in m
        port = int(config["sinks"]["metrics"]["listenAddr"].rpartition(":")[2])
        (declared,) = container["ports"]
        assert declared == {"name": "metrics", "containerPort": port, "protocol": "TCP"}
        env = {e["name"]: e for e in container["env"]}
        assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_probes_grace_and_rollout() -> None:
    rendered = render({**ALL_TIERS, "shutdownGraceSeconds": 25.5})
    for ds in rendered.daemonsets().values():
        container = agent(ds)
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
        assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
        _, config = rendered.config_of(ds)
        assert config["shutdownGraceSeconds"] == 25.5
        assert pod_spec(ds)["terminationGracePeriodSeconds"] > config["shutdownGraceSeconds"]
        assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
    default = render().daemonsets()["core"]
    assert pod_spec(default)["terminationGracePeriodSeconds"] > 10


def _sums(rendered: Rendered) -> dict[str, tuple[str, str]]:
    out = {}
    for component, ds in rendered.daemonsets().items():
        ann = ds["spec"]["template"]["metadata"]["annotations"]
        out[component] = (ann["checksum/config"], ann["checksum/secret"])
    return out


BASE: dict[str, Any] = {
    **ALL_TIERS,
    **WEBHOOKS,
    "smartRules": [{"metric": "smart_pending_sectors", "threshold": 0, "condition": "pending"}],
}


@pytest.mark.parametrize(
    ("change", "config_changes", "secret_changes"),
    [
        ({"rules": [{"metric": "load1", "threshold": 64, "condition": "load_high"}]}, {"core"}, False),
        (
            {"smartRules": [{"metric": "smart_pending_sectors", "threshold": 8, "condition": "pending"}]},
            {"smart"},
            False,
        ),
        (
            {"gpuRules": [{"metric": "gpu_temperature_celsius", "threshold": 90, "condition": "gpu_hot"}]},
            {"gpu"},
            False,
        ),
        ({"intervalSeconds": 30}, {"core", "smart", "gpu"}, False),
        ({"webhooks": [{**WEBHOOKS["webhooks"][0], "secret": SECRET_B}, *WEBHOOKS["webhooks"][1:]]}, set(), True),
        (
            {
                "webhooks": [
                    {**WEBHOOKS["webhooks"][0], "existingSecret": {"name": "x", "key": "y"}},
                    *WEBHOOKS["webhooks"][1:],
                ]
            },
            set(),
            True,
        ),
        ({"image": {"tag": "9.9.9"}}, set(), False),
        ({"resources": {"limits": {"memory": "1Gi"}}}, set(), False),
        ({"tolerations": [{"operator": "Exists"}]}, set(), False),
        ({"podAnnotations": {"a": "b"}, "priorityClassName": "system-node-critical"}, set(), False),
        ({"updateStrategy": {"type": "OnDelete"}}, set(), False),
        ({"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}, set(), False),
        (NODE_EXPORTER, {"core"}, False),  # only the core tier runs the node_exporter drop-in
    ],
)
def test_checksums_change_with_what_the_pods_read_and_only_then(
    change: dict[str, Any], config_changes: set[str], secret_changes: bool
) -> None:
    before = _sums(render(BASE))
    after = _sums(render(deep_merge(BASE, change)))
    assert before.keys() == after.keys()
    assert {c for c in before if before[c][0] != after[c][0]} == config_changes
    assert {c for c in before if before[c][1] != after[c][1]} == (set(before) if secret_changes else set())


def test_config_checksum_is_the_hash_of_the_mounted_config() -> None:
    rendered = render(BASE)
    for ds in rendered.daemonsets().values():
        text, _ = rendered.config_of(ds)
        digest = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        assert digest == hashlib.sha256(text.rstrip("\n").encode()).hexdigest()


def test_monitoring_objects() -> None:
    rendered = render(MATRIX["monitoring"])
    (svc,) = rendered.kind("Service")
    (sm,) = rendered.kind("ServiceMonitor")
    assert svc["spec"]["clusterIP"] == "None"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    for ds in rendered.kind("DaemonSet"):
        assert svc["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert render().kind("Service") == render().kind("ServiceMonitor") == render().kind("PrometheusRule") == []


def test_prometheus_rule_alerts_on_the_agents_own_health(tmp_path: Path) -> None:
    (rule,) = render(MATRIX["monitoring"]).kind("PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "nodevitals_collector_success" in alerts["NvdaemonCollectorFailing"]
    assert "nodevitals_delivery_backlog" in alerts["NvdaemonDeliveryBacklogGrowing"]
    assert "nvsentinel_health_events_publisher_sends_error_total" in alerts["NvdaemonNvsentinelSendsFailing"]
    assert alerts["NvdaemonStateDirUnwritable"] == "nodevitals_sink_state_writable == 0"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian package prometheus): PromQL of the alerts not checked")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "bad",
    [
        {"tiers": {"core": {"enabeld": True}}},
        {"rules": [{"metric": "load1", "threshold": 1, "condition": "x", "severty": "warning"}]},
        {"rules": [{"metric": "load1", "condition": "x"}]},
        {"webhooks": [{"url": "https://x.example", "secrt": "s"}]},
        {"updateStrategy": "fast"},
        {"intervalSeconds": "15s"},
        {"history": {"retentionDay": 30}},
        {"serviceMonitor": {"interval": "thirty"}},
        {"nodeExporter": {"enabeld": True}},
        {"nodeExporter": {"enabled": True, "textfile": TEXTFILE_DIR}},
        {"nodeExporter": {"enabled": True, "collectors": {"hwmom": False}}},
        {"nodeExporter": {"enabled": True, "collectors": {"infiniband": "off"}}},
        {"nodeExporter": {"enabled": True, "collectors": ["cpu"]}},
        {"nodeExporter": {"enabled": True, "textfileDirectory": "var/lib/node_exporter"}},
        {"nodeExporter": {"enabled": True, "textfileDirectory": "/var/lib/node_exporter/"}},
        {"nodeExporter": {"enabled": True, "diskstats": {"deviceExlude": "^loop"}}},
        {"nodeExporter": {"enabled": True, "filesystem": {"mountPointExclude": "^/run"}}},
        {"nodeExporter": {"enabled": True, "filesystem": {"mountTimeoutSeconds": 0}}},
        {"nodeExporter": {"enabled": True, "netdev": {"deviceInclude": ["eth0"]}}},
        {"nodeExporter": {"enabled": True, "hwmon": {"chipExclude": "x", "chipInclud": "y"}}},
        {"nodeExporter": {"enabled": True, "textfile": {"directory": TEXTFILE_DIR}}},
    ],
)
def test_values_schema_rejects_typos(bad: dict[str, Any]) -> None:
    with pytest.raises(helm.RenderError, match="values don't meet the specifications of the schema"):
        render(bad)


def test_notes_give_pod_security_guidance_per_tier(tmp_path: Path) -> None:
    text = notes(tmp_path, {**ALL_TIERS, **NVSENTINEL})
    for word in ("core:", "smart:", "gpu:", "Baseline", "Restricted", "CAP_SYS_RAWIO", "RuntimeClass", "NVSentinel"):
        assert word in text
    assert "kubectl label namespace nvdaemon-system pod-security.kubernetes.io/enforce=privileged" in text
    assert "DaemonSet nv-nvdaemon-smart (tiers: smart)" in text
    assert "metrics.apiToken.existingSecret" in text
    assert "port-forward ds/nv-nvdaemon-core 9847" in text
    single = notes(tmp_path / "single", {**ALL_TIERS, "singlePod": True, **EXISTING_SECRET})
    assert "DaemonSet nv-nvdaemon (tiers: core, smart, gpu)" in single
    assert "port-forward ds/nv-nvdaemon 9847" in single
    assert "NVSentinel:" not in single and "metrics.apiToken.existingSecret" not in single
    # The command names a DaemonSet that exists: the first tier enabled, or none at all.
    gpu = notes(tmp_path / "gpu", MATRIX["gpu-only-no-hostpath"])
    assert "port-forward ds/nv-nvdaemon-gpu 9847" in gpu and "nv-nvdaemon-core" not in gpu
    none = notes(tmp_path / "none", {"tiers": {"core": {"enabled": False}}})
    assert "no DaemonSet: every tier is disabled" in none and "port-forward" not in none


def test_values_nvsentinel_default_matches_the_issue() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["nvsentinel"]["tokenAudience"] == "platform-connector.nvsentinel.nvidia.com"
    assert values["nvsentinel"]["tokenExpirationSeconds"] == 3600
    assert values["nvsentinel"]["socketHostPath"] == "/var/run/nvsentinel"


def test_image_defaults_to_app_version_and_digest_pins() -> None:
    import nvdaemon

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == nvdaemon.__version__
    ds = render().daemonsets()["core"]
    assert agent(ds)["image"].endswith(f":{nvdaemon.__version__}")
    digest = "sha256:" + "a" * 64
    pinned = render({"image": {"digest": digest}}).daemonsets()["core"]
    assert agent(pinned)["image"] == f"ghcr.io/nvdaemon/nvdaemon@{digest}"
    assert pod_spec(pinned)["initContainers"][0]["image"] == agent(pinned)["image"]


def _host_root_and_textfile(rendered: Rendered, component: str) -> tuple[dict[str, Any], set[str], set[str]]:
    """The component's config, the paths its agent mounts, and the host paths its pod mounts."""
    ds = rendered.daemonsets()[component]
    host_paths = {v["hostPath"]["path"] for v in pod_spec(ds)["volumes"] if "hostPath" in v}
    return rendered.config_of(ds)[1], set(mounts(ds)), host_paths


@pytest.mark.parametrize(("case", "component"), [("node-exporter", "core"), ("node-exporter-single-pod", "agent")])
def test_node_exporter_gets_its_config_the_host_root_and_the_textfile_directory(case: str, component: str) -> None:
    rendered = render(MATRIX[case])
    ds = rendered.daemonsets()[component]
    config, _, host_paths = _host_root_and_textfile(rendered, component)
    # The whole section as set in values, nothing more: unset filters are left to the agent's defaults.
    assert config["nodeExporter"] == {**NODE_EXPORTER["nodeExporter"], "rootfsPath": "/host/root"}
    assert "rootfs" not in config, "the Go key (nodeExporter.rootfsPath) says it"
    assert (config["procRoot"], config["sysRoot"]) == ("/host/proc", "/host/sys")
    root = mounts(ds)["/host/root"]
    assert root["readOnly"] is True
    assert root["mountPropagation"] == "HostToContainer"
    assert root["volume"]["hostPath"] == {"path": "/", "type": "Directory"}
    textfile = mounts(ds)[TEXTFILE_DIR]
    assert textfile["readOnly"] is True
    assert textfile["volume"]["hostPath"] == {"path": TEXTFILE_DIR, "type": "DirectoryOrCreate"}
    assert {"/", TEXTFILE_DIR} <= host_paths
    # The host's procfs: /host/proc/1/mounts is the host's init, so no hostPID; the host network for /proc/net.
    spec = pod_spec(ds)
    assert "hostPID" not in spec
    assert spec["hostNetwork"] is True


def test_node_exporter_keeps_the_core_security_posture() -> None:
    before = render().daemonsets()["core"]
    after = render(NODE_EXPORTER).daemonsets()["core"]
    assert agent(after)["securityContext"] == agent(before)["securityContext"]
    assert agent(after)["securityContext"]["runAsNonRoot"] is True
    assert agent(after)["securityContext"]["readOnlyRootFilesystem"] is True
    assert agent(after)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec(after)["securityContext"] == pod_spec(before)["securityContext"]
    assert pod_spec(after)["initContainers"] == pod_spec(before)["initContainers"]
    assert baseline_violations(pod_spec(after)) == baseline_violations(pod_spec(before))
    assert restricted_violations(_without_init(pod_spec(after))) == {"hostPathVolumes", "hostNamespaces", "volumeTypes"}


def test_node_exporter_runs_in_the_core_tier_only() -> None:
    rendered = render(MATRIX["node-exporter"])
    for component in ("smart", "gpu"):
        config, paths, host_paths = _host_root_and_textfile(rendered, component)
        assert "nodeExporter" not in config and "rootfs" not in config, component
        assert "/host/root" not in paths and TEXTFILE_DIR not in paths, component
        assert "/" not in host_paths and TEXTFILE_DIR not in host_paths, component
    # Enabled without the core tier: nothing of it anywhere.
    gpu_only = render({**NODE_EXPORTER, "tiers": {"core": {"enabled": False}, "gpu": {"enabled": True}}})
    config, paths, host_paths = _host_root_and_textfile(gpu_only, "gpu")
    assert "nodeExporter" not in config and "/host/root" not in paths and "/" not in host_paths


@pytest.mark.parametrize(
    "values",
    [
        {},
        ALL_TIERS,
        {"singlePod": True},
        # Off, with everything else of the section set: still nothing rendered.
        {"nodeExporter": {**NODE_EXPORTER["nodeExporter"], "enabled": False}},
        {**ALL_TIERS, "singlePod": True, "nodeExporter": {**NODE_EXPORTER["nodeExporter"], "enabled": False}},
    ],
)
def test_node_exporter_off_renders_none_of_it(values: dict[str, Any]) -> None:
    rendered = render(values)
    assert rendered.daemonsets()
    for component, ds in rendered.daemonsets().items():
        config, paths, host_paths = _host_root_and_textfile(rendered, component)
        assert "nodeExporter" not in config and "rootfs" not in config, component
        assert "/host/root" not in paths and TEXTFILE_DIR not in paths, component
        assert "/" not in host_paths and TEXTFILE_DIR not in host_paths, component
        names = {v["name"] for v in pod_spec(ds)["volumes"]}
        assert not names & {"host-root", "textfile", "udev-data"}, component
        assert all("mountPropagation" not in m for m in agent(ds)["volumeMounts"]), component


def test_node_exporter_renders_only_the_keys_set() -> None:
    rendered = render({"nodeExporter": {"enabled": True, "textfileDir": ""}})
    config, paths, host_paths = _host_root_and_textfile(rendered, "core")
    # collectors {}, textfile directory "": left to the agent
    assert config["nodeExporter"] == {"enabled": True, "rootfsPath": "/host/root"}
    assert "/host/root" in paths
    assert host_paths == {"/proc", "/sys", "/", "/run/udev/data", "/var/lib/nvdaemon/core"}, "no textfile mount"
    # The Go chart's default textfile directory, unless it is set to "".
    go_default = render({"nodeExporter": {"enabled": True}})
    config, paths, host_paths = _host_root_and_textfile(go_default, "core")
    assert config["nodeExporter"] == {"enabled": True, "rootfsPath": "/host/root", "textfileDirectory": TEXTFILE_DIR}
    assert TEXTFILE_DIR in paths and TEXTFILE_DIR in host_paths
    # Empty filter sections are left out; a filter set to "" is kept (it means: no filter, not the default).
    empty = render({"nodeExporter": {"enabled": True, "textfileDir": "", "netdev": {}, "hwmon": {"chipExclude": ""}}})
    assert empty.config_of(empty.daemonsets()["core"])[1]["nodeExporter"] == {
        "enabled": True,
        "rootfsPath": "/host/root",
        "hwmon": {"chipExclude": ""},
    }


@pytest.mark.parametrize(
    "directory", ["/tmp", "/etc/nvdaemon", "/var/lib/nvdaemon/textfile", "/host", "/host/root/var/lib/x", "/var"]
)
def test_textfile_directory_may_not_shadow_the_charts_own_mounts(directory: str) -> None:
    with pytest.raises(helm.RenderError, match=r"nodeExporter\.textfileDirectory \S+ overlaps"):
        render({"nodeExporter": {"enabled": True, "textfileDirectory": directory}})
    with pytest.raises(helm.RenderError, match=r"nodeExporter\.textfileDir \S+ overlaps"):
        render({"nodeExporter": {"enabled": True, "textfileDir": directory}})
    ok = render({"nodeExporter": {"enabled": True, "textfileDirectory": "/var/lib/node_exporter"}})
    assert "/var/lib/node_exporter" in mounts(ok.daemonsets()["core"])


def test_notes_say_what_the_node_exporter_drop_in_needs(tmp_path: Path) -> None:
    text = notes(tmp_path, NODE_EXPORTER)
    assert "node_exporter drop-in" in text
    for word in ("/host/root", "HostToContainer", "no hostPID", TEXTFILE_DIR, "its / read-only"):
        assert word in text, word
    assert "WARNING" not in text
    # The host network is forced on with the drop-in (as in the Go chart): nothing to warn about.
    no_net_values = {**NODE_EXPORTER, "tiers": {"core": {"hostNetwork": False}}}
    assert pod_spec(render(no_net_values).daemonsets()["core"])["hostNetwork"] is True
    no_net = notes(tmp_path / "no-net", no_net_values)
    assert "WARNING" not in no_net and "host network" in no_net
    no_core = notes(tmp_path / "no-core", {**NODE_EXPORTER, "tiers": {"core": {"enabled": False}}})
    assert "WARNING: nodeExporter.enabled has no effect" in no_core
    off = notes(tmp_path / "off", {})
    assert "node_exporter" not in off and "/host/root" not in off


def test_history_store_follows_state_dir_and_may_not_shadow_the_charts_own_mounts() -> None:
    """history.enabled with stateDir.enabled=false (no hostPath allowed): an emptyDir, and nothing to chown."""
    values = {**MATRIX["gpu-only-no-hostpath"], **HISTORY}
    gpu = render(values).daemonsets()["gpu"]
    store = mounts(gpu)["/var/lib/nodevitals/history"]
    assert store["volume"] == {"name": store["name"], "emptyDir": {}}
    assert "initContainers" not in pod_spec(gpu)
    assert restricted_violations(pod_spec(gpu)) == set()
    for directory in ("/var/lib/nvdaemon/history", "/tmp/history", "/host", "/etc"):
        with pytest.raises(helm.RenderError, match=r"history\.mountPath \S+ overlaps"):
            render({"history": {"enabled": True, "mountPath": directory}})
    with pytest.raises(helm.RenderError, match="overlaps the textfile directory"):
        render({**NODE_EXPORTER, "history": {"enabled": True, "mountPath": TEXTFILE_DIR}})
    with pytest.raises(helm.RenderError, match="values don't meet the specifications of the schema"):
        render({"history": {"enabled": True, "hostPath": "/"}})
