"""The Go agent's chart values (contract §5), installed unchanged: the Go values file, rendered by the real helm,
passes values.schema.json, every manifest passes kubernetes-validate --strict, every ConfigMap passes
`nvdaemon check-config`, and each key renders what it rendered in the Go chart (asserted on the rendered objects).

The variants are the Go file with the switches a Go operator flips (`--set tiers.gpu.enabled=true` and so on)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

import nvdaemon
from nvdaemon.configload import parse_config
from tests.deploy import helm
from tests.deploy.helm import CHART, Doc, Rendered, agent, deep_merge, mounts, notes, pod_spec, render
from tests.deploy.matrix import GO_VALUES
from tests.deploy.test_chart_config import check_rendered_configs

GO: dict[str, Any] = yaml.safe_load(GO_VALUES.read_text())
UID = 65532
NVIDIA_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_SELECTOR = {"nvidia.com/gpu.present": "true"}
ALL = {"core": {"enabled": True}, "smart": {"enabled": True}, "gpu": {"enabled": True}}
HOOK_SECRET = "whsec_bm9kZXZpdGFscy1nby12YWx1ZXMtdGVzdC1zZWNyZXQh"


def go(**over: Any) -> dict[str, Any]:
    """The Go values file with ``over`` merged in, as `helm --set` would."""
    return deep_merge(copy.deepcopy(GO), over)


VARIANTS: dict[str, dict[str, Any]] = {
    "as-is": GO,
    "all-tiers": go(tiers=ALL),
    "single-pod": go(tiers=ALL, singlePod=True),
    "single-pod-gpu-only": go(tiers={"core": {"enabled": False}, "gpu": {"enabled": True}}, singlePod=True),
    "history": go(tiers=ALL, history={"enabled": True, "metrics": ["gpu_temperature_celsius", "load1"]}),
    "history-single-pod": go(tiers=ALL, singlePod=True, history={"enabled": True}),
    "history-single-pod-core-gpu": go(tiers={"gpu": {"enabled": True}}, singlePod=True, history={"enabled": True}),
    "node-exporter": go(nodeExporter={"enabled": True, "extraFlags": ["--no-collector.zfs", "--no-collector.nvme"]}),
    "node-exporter-no-rootfs": go(nodeExporter={"enabled": True, "mountRootFS": False, "mountSystemd": True}),
    "host-network": go(tiers=ALL, hostNetwork=True),
    "runtime-class": go(tiers={"gpu": {"enabled": True, "runtimeClassName": "nvidia"}}),
    "webhooks-and-monitoring": go(
        webhooks=[{"url": "https://backend.example/hook", "secret": HOOK_SECRET}],
        serviceMonitor={"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        tiers={"smart": {"enabled": True, "privileged": True}},
    ),
}


def env_of(ds: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in agent(ds).get("env", [])}


# --- installs unchanged --------------------------------------------------------------------------------------------


def test_helm_lint_strict_takes_the_go_values_file_as_it_is() -> None:
    # The fixture is the Go chart's whole values file: a key missing from it would go untested.
    keys = {
        "image": {"repository", "tag", "pullPolicy"},
        "nodeExporter": {"enabled", "mountRootFS", "textfileDir", "mountUdev", "mountSystemd", "extraFlags"},
        "history": {"enabled", "retentionDays", "intervalMinutes", "hostPath", "mountPath", "metrics", "chownImage"},
        "updateStrategy": {"maxUnavailable"},
        "serviceMonitor": {"enabled", "interval", "labels"},
        "resources": {"requests", "limits"},
        "metrics": {"port"},
        "dcgmCompat": {"enabled"},
        "smartctlCompat": {"enabled"},
    }
    for section, names in keys.items():
        assert set(GO[section]) == names, section
    assert set(GO["tiers"]["gpu"]) == {"enabled", "runtimeClassName"}
    assert set(GO["tiers"]["smart"]) == {"enabled", "privileged"}
    scalars = {"singlePod", "hostNetwork", "intervalSeconds", "rules", "smartRules", "gpuRules", "webhooks"}
    assert set(GO) == set(keys) | scalars | {"tiers"}
    assert GO["tiers"]["gpu"]["runtimeClassName"] == "" and GO["hostNetwork"] is False
    proc = helm.run_helm("lint", "--strict", str(CHART), "-f", str(GO_VALUES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout
    proc = helm.run_helm("template", helm.RELEASE, str(CHART), "-n", helm.NAMESPACE, "-f", str(GO_VALUES))
    assert proc.returncode == 0, proc.stderr
    assert [d["kind"] for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "DaemonSet"] == ["DaemonSet"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_is_valid_kubernetes(variant: str) -> None:
    rendered = render(VARIANTS[variant])
    assert rendered.kind("DaemonSet")
    for doc in rendered.docs:
        if doc["kind"] != "ServiceMonitor":  # a CRD: not in kubernetes-validate's bundled schemas
            helm.assert_valid_kubernetes(doc, variant)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_config_passes_check_config(variant: str, tmp_path: Path) -> None:
    checked = check_rendered_configs(render(VARIANTS[variant]), tmp_path)
    assert checked, f"{variant}: renders no DaemonSet"
    for component, path, _, proc in checked:
        assert proc.returncode == 0, f"{variant}/{component}: the agent rejects the chart's config:\n{proc.stderr}"
        assert f"{path}: ok (node node-a" in proc.stdout


@pytest.mark.parametrize(
    ("typo", "reported"),
    [
        ({"hostNetwrok": True}, "additional properties 'hostNetwrok' not allowed"),
        ({"history": {"hostpath": "/var/lib/nodevitals/history"}}, "'hostpath' not allowed"),
        ({"history": {"chownImg": "busybox"}}, "'chownImg' not allowed"),
        ({"history": {"mountPath": "relative/history"}}, "at '/history/mountPath'"),
        ({"nodeExporter": {"mountRootFs": True}}, "'mountRootFs' not allowed"),
        ({"nodeExporter": {"textfileDirs": "/x"}}, "'textfileDirs' not allowed"),
        ({"nodeExporter": {"mountUdev": "yes"}}, "at '/nodeExporter/mountUdev': got string, want boolean"),
        ({"nodeExporter": {"extraFlags": ["--path.rootfs=/"]}}, "at '/nodeExporter/extraFlags/0'"),
        ({"updateStrategy": {"maxUnavailabe": 1}}, "'maxUnavailabe' not allowed"),
        ({"updateStrategy": {"maxUnavailable": "ten"}}, "at '/updateStrategy/maxUnavailable'"),
        ({"tiers": {"gpu": {"runtimeClassname": ""}}}, "'runtimeClassname' not allowed"),
        ({"tiers": {"smart": {"priviledged": True}}}, "'priviledged' not allowed"),
        ({"serviceMonitor": {"intervl": "30s"}}, "'intervl' not allowed"),
        ({"smartRules": [{"metric": "m", "device": "", "threshold": 0, "conditon": "x"}]}, "'conditon' not allowed"),
    ],
)
def test_the_schema_still_rejects_typos(typo: dict[str, Any], reported: str) -> None:
    """One typo in the Go file is rejected, naming the typo (the file without it renders)."""
    assert render(GO).kind("DaemonSet"), "the Go file itself renders"
    with pytest.raises(helm.RenderError, match="values don't meet the specifications of the schema") as info:
        render(go(**typo))
    assert reported in str(info.value)


# --- and means what it meant ---------------------------------------------------------------------------------------


def _rules(rendered: Rendered, component: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = rendered.config_of(rendered.daemonsets()[component])[1].get("rules", [])
    return rules


def test_default_rules_are_gos_and_single_pod_concatenates_them() -> None:
    split = render(VARIANTS["all-tiers"])
    assert _rules(split, "core") == GO["rules"]
    assert _rules(split, "smart") == GO["smartRules"]
    assert _rules(split, "gpu") == GO["gpuRules"]
    single = render(VARIANTS["single-pod"])
    assert _rules(single, "agent") == GO["rules"] + GO["smartRules"] + GO["gpuRules"]
    # Our chart's own defaults are the same lists: a default install raises the events a Go install raised.
    ours = render({"tiers": ALL, "singlePod": True})
    assert _rules(ours, "agent") == GO["rules"] + GO["smartRules"] + GO["gpuRules"]


@pytest.mark.parametrize(("variant", "component"), [("all-tiers", "gpu"), ("single-pod", "agent")])
def test_the_gpu_pods_get_the_nvidia_env(variant: str, component: str) -> None:
    rendered = render(VARIANTS[variant])
    ds = rendered.daemonsets()[component]
    env = env_of(ds)
    assert {k: env[k] for k in NVIDIA_ENV} == NVIDIA_ENV
    assert GPU_TOLERATION in pod_spec(ds)["tolerations"]
    assert "runtimeClassName" not in pod_spec(ds), 'runtimeClassName "" renders none'
    for other, other_ds in rendered.daemonsets().items():
        if other != component:
            assert not set(env_of(other_ds)) & set(NVIDIA_ENV), other


def test_the_gpu_daemonset_is_pinned_to_gpu_nodes_and_the_runtime_class_is_set_only_when_given() -> None:
    gpu = render(VARIANTS["all-tiers"]).daemonsets()["gpu"]
    assert pod_spec(gpu)["nodeSelector"] == GPU_SELECTOR
    assert "nodeSelector" not in pod_spec(render(VARIANTS["all-tiers"]).daemonsets()["core"])
    named = render(VARIANTS["runtime-class"]).daemonsets()["gpu"]
    assert pod_spec(named)["runtimeClassName"] == "nvidia"


def test_single_pod_keeps_one_pod_on_every_node_of_a_mixed_fleet(tmp_path: Path) -> None:
    mixed = render(VARIANTS["single-pod"])
    assert list(mixed.daemonsets()) == ["agent"]
    spec = pod_spec(mixed.daemonsets()["agent"])
    assert "nodeSelector" not in spec, "a mixed fleet keeps one pod on every node"
    assert GPU_TOLERATION in spec["tolerations"], "GPU nodes' taint is tolerated"
    assert agent(mixed.daemonsets()["agent"])["securityContext"]["runAsUser"] == 0, "root with smart, as in Go"
    core_gpu = render(go(tiers={"gpu": {"enabled": True}}, singlePod=True)).daemonsets()["agent"]
    assert "nodeSelector" not in pod_spec(core_gpu)
    gpu_only = render(VARIANTS["single-pod-gpu-only"]).daemonsets()["agent"]
    assert pod_spec(gpu_only)["nodeSelector"] == GPU_SELECTOR, "gpu alone: GPU nodes only"
    # A RuntimeClass runs every node's pod under its handler: NOTES says so where the fleet may be mixed.
    assert "runtimeClassName" not in pod_spec(mixed.daemonsets()["agent"])
    assert "cannot start the pod" not in notes(tmp_path / "go", VARIANTS["single-pod"])
    named = deep_merge(VARIANTS["single-pod"], {"tiers": {"gpu": {"runtimeClassName": "nvidia"}}})
    assert pod_spec(render(named).daemonsets()["agent"])["runtimeClassName"] == "nvidia"
    assert "cannot start the pod" in notes(tmp_path / "named", named)


def _init(ds: Doc, name: str) -> dict[str, Any] | None:
    found = [c for c in pod_spec(ds).get("initContainers", []) if c["name"] == name]
    return found[0] if found else None


@pytest.mark.parametrize(
    ("variant", "expected"),
    [
        ("history", {"core": "core", "smart": "smart", "gpu": "gpu"}),
        ("history-single-pod", {"agent": "all"}),
        ("history-single-pod-core-gpu", {"agent": "all"}),
    ],
)
def test_history_is_a_host_path_at_mount_path_with_its_chown(variant: str, expected: dict[str, str]) -> None:
    rendered = render(VARIANTS[variant])
    assert set(rendered.daemonsets()) == set(expected)
    history = GO["history"]
    for component, ds in rendered.daemonsets().items():
        config = rendered.config_of(ds)[1]["history"]
        assert config["dataDir"] == history["mountPath"]
        assert config["enabled"] is True and config["retentionDays"] == 1825 and config["intervalMinutes"] == 5
        assert not {"hostPath", "mountPath", "chownImage"} & set(config), "chart keys stay out of the agent's config"
        mount = mounts(ds)[history["mountPath"]]
        assert mount.get("readOnly") is not True
        # One directory per DaemonSet under hostPath: two agents on a node never share a store.
        assert mount["volume"]["hostPath"] == {
            "path": f"{history['hostPath']}/{expected[component]}",
            "type": "DirectoryOrCreate",
        }
        root = agent(ds)["securityContext"]["runAsUser"] == 0
        chown = _init(ds, "history-chown")
        if root:
            assert chown is None, f"{component}: root owns the directory already"
            continue
        assert chown is not None, component
        assert agent(ds)["securityContext"]["runAsUser"] == UID
        assert chown["image"] == history["chownImage"]
        assert chown["command"] == ["chown", "-R", f"{UID}:{UID}", history["mountPath"]]
        ctx = chown["securityContext"]
        assert ctx["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
        assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
        assert chown["volumeMounts"] == [{"name": mount["name"], "mountPath": history["mountPath"]}]
    off = render(GO)
    for ds in off.daemonsets().values():
        assert history["mountPath"] not in mounts(ds) and _init(ds, "history-chown") is None
        assert "history" not in off.config_of(ds)[1]


def _host_network(rendered: Rendered) -> dict[str, bool]:
    return {c: pod_spec(ds).get("hostNetwork", False) for c, ds in rendered.daemonsets().items()}


def test_host_network_is_off_unless_set_and_forced_on_with_node_exporter() -> None:
    # The Go key is false; the core pod is on the host network through our tiers.core.hostNetwork (default true),
    # since its NIC counters (/proc/net/dev) are per network namespace. Off both ways: no pod on it.
    assert _host_network(render(VARIANTS["all-tiers"])) == {"core": True, "smart": False, "gpu": False}
    no_core_net = go(tiers={**ALL, "core": {"enabled": True, "hostNetwork": False}})
    assert _host_network(render(no_core_net)) == {"core": False, "smart": False, "gpu": False}
    # hostNetwork: true puts the core (or singlePod) pod on it, as the Go chart did; never smart or gpu.
    forced = deep_merge(no_core_net, {"hostNetwork": True})
    assert _host_network(render(forced)) == {"core": True, "smart": False, "gpu": False}
    single = deep_merge(forced, {"singlePod": True, "tiers": {"core": {"enabled": False}}})
    assert _host_network(render(single)) == {"agent": True}
    # nodeExporter forces it on, whatever both keys say.
    exporter = deep_merge(no_core_net, {"nodeExporter": {"enabled": True}})
    assert _host_network(render(exporter)) == {"core": True, "smart": False, "gpu": False}
    assert pod_spec(render(exporter).daemonsets()["core"])["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_node_exporter_keys_render_as_go_meant() -> None:
    rendered = render(VARIANTS["node-exporter"])
    ds = rendered.daemonsets()["core"]
    ne = rendered.config_of(ds)[1]["nodeExporter"]
    m = mounts(ds)
    textfile = GO["nodeExporter"]["textfileDir"]
    # mountRootFS: the host's / read-only at /host/root, and the agent's rootfsPath there.
    assert ne["rootfsPath"] == "/host/root"
    assert m["/host/root"]["volume"]["hostPath"] == {"path": "/", "type": "Directory"}
    assert m["/host/root"]["readOnly"] is True and m["/host/root"]["mountPropagation"] == "HostToContainer"
    # mountUdev: the host's udev database, read-only, where the agent reads it (<rootfs>/run/udev/data).
    assert m["/host/root/run/udev/data"]["volume"]["hostPath"]["path"] == "/run/udev/data"
    assert m["/host/root/run/udev/data"]["readOnly"] is True
    # textfileDir: the host directory mounted read-only at the same path, and the agent's textfile directory.
    assert ne["textfileDirectory"] == textfile
    assert m[textfile]["volume"]["hostPath"] == {"path": textfile, "type": "DirectoryOrCreate"}
    assert m[textfile]["readOnly"] is True
    # extraFlags: passed to the agent as they are.
    assert ne["extraFlags"] == ["--no-collector.zfs", "--no-collector.nvme"]
    # mountSystemd false: nothing of /run/systemd.
    assert not [p for p in m if "systemd" in p]


def test_node_exporter_without_the_root_fs_turns_the_filesystem_collector_off(tmp_path: Path) -> None:
    values = VARIANTS["node-exporter-no-rootfs"]
    rendered = render(values)
    ds = rendered.daemonsets()["core"]
    text, config = rendered.config_of(ds)
    assert config["nodeExporter"]["rootfsPath"] == "", "the Go agent's meaning: no filesystem collector"
    assert "rootfs" not in config
    m = mounts(ds)
    assert "/host/root" not in m
    assert m["/run/udev/data"]["volume"]["hostPath"]["path"] == "/run/udev/data", "udev data where rootfs / reads it"
    # mountSystemd: accepted, and nothing mounted (no systemd collector here); NOTES says why.
    host_paths = {v["hostPath"]["path"] for v in pod_spec(ds)["volumes"] if "hostPath" in v}
    assert not [p for p in host_paths if "systemd" in p] and not [p for p in m if "systemd" in p]
    assert "node_systemd_* is not served" in notes(tmp_path, values)
    loaded = parse_config(text, "core.yaml", env={"NODE_NAME": "node-a"}).config
    assert loaded.node_exporter.collectors.get("filesystem") is False


def test_resources_from_the_go_file_are_honoured_and_notes_warn(tmp_path: Path) -> None:
    for ds in render(VARIANTS["all-tiers"]).daemonsets().values():
        assert agent(ds)["resources"] == GO["resources"]
    # The Go file's 64Mi limit holds the measured peak of every pod shape (bench/rss.py): no warning.
    assert "resources.limits.memory" not in notes(tmp_path, GO)
    # Ours, left alone: a 2x margin over the largest measured peak, and no warning.
    ours = render().daemonsets()["core"]
    assert agent(ours)["resources"] == {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
    assert "resources.limits.memory" not in notes(tmp_path / "ours", {})
    assert "resources.limits.memory" not in notes(tmp_path / "gi", {"resources": {"limits": {"memory": "1Gi"}}})
    low = notes(tmp_path / "low", {"resources": {"limits": {"memory": "48Mi"}}})
    assert "WARNING: resources.limits.memory is 48Mi" in low
    low_bytes = notes(tmp_path / "bytes", {"resources": {"limits": {"memory": 50_000_000}}})
    assert "WARNING: resources.limits.memory is 50000000" in low_bytes


def test_update_strategy_max_unavailable() -> None:
    for ds in render(VARIANTS["all-tiers"]).daemonsets().values():
        assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    ours = render().daemonsets()["core"]
    assert ours["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
    on_delete = render({"updateStrategy": {"type": "OnDelete"}}).daemonsets()["core"]
    assert on_delete["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_the_go_image_stands_for_ours(tmp_path: Path) -> None:
    ours = f"ghcr.io/nvdaemon/nvdaemon:{nvdaemon.__version__}"
    for ds in render(VARIANTS["all-tiers"]).daemonsets().values():
        assert agent(ds)["image"] == ours
        assert agent(ds)["imagePullPolicy"] == GO["image"]["pullPolicy"]
    pinned = render(go(image={"tag": "0.8.5"})).daemonsets()["core"]
    assert agent(pinned)["image"] == ours, "a Go release's tag names no nvdaemon image"
    assert "is the Go agent's image" in notes(tmp_path, GO)
    mirror = render(go(image={"repository": "registry.example/nvdaemon", "tag": "0.1.0"})).daemonsets()["core"]
    assert agent(mirror)["image"] == "registry.example/nvdaemon:0.1.0"


def test_webhooks_metrics_port_and_service_monitor() -> None:
    rendered = render(VARIANTS["webhooks-and-monitoring"])
    assert list(rendered.secret_data().values()) == [HOOK_SECRET]
    for ds in rendered.daemonsets().values():
        config = rendered.config_of(ds)[1]
        assert config["sinks"]["webhook"] == [{"url": "https://backend.example/hook", "secret": "${WEBHOOK_SECRET_0}"}]
        assert config["sinks"]["metrics"]["listenAddr"].endswith(":9847")
        assert agent(ds)["ports"] == [{"name": "metrics", "containerPort": 9847, "protocol": "TCP"}]
        assert HOOK_SECRET not in yaml.safe_dump(ds) and HOOK_SECRET not in yaml.safe_dump(config)
    (monitor,) = rendered.kind("ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["interval"] == "30s"
    assert "scrapeTimeout" not in monitor["spec"]["endpoints"][0]  # Prometheus's own, never over the interval
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    smart = rendered.daemonsets()["smart"]
    assert agent(smart)["securityContext"]["privileged"] is True, "tiers.smart.privileged"


def test_service_monitor_with_a_short_go_interval_is_valid() -> None:
    """The Go chart has no scrapeTimeout: its values file with a 5s interval must not get a timeout over it, which
    prometheus-operator refuses (the target would not be scraped at all)."""
    values = go(serviceMonitor={"enabled": True, "interval": "5s", "labels": {"release": "prom"}})
    (endpoint,) = render(values).kind("ServiceMonitor")[0]["spec"]["endpoints"]
    assert endpoint["interval"] == "5s"
    assert "scrapeTimeout" not in endpoint
    asked = go(serviceMonitor={"enabled": True, "interval": "30s", "scrapeTimeout": "20s"})
    assert render(asked).kind("ServiceMonitor")[0]["spec"]["endpoints"][0]["scrapeTimeout"] == "20s"
