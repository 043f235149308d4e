"""dcgmCompat.podAttribution in the chart: the gpu pod (or the single pod) mounts the kubelet's pod-resources
directory read-only and names the socket in its config; it runs as uid 0 without capabilities, or as uid 65532 with
the socket's group; the agent accepts the rendered config; nothing changes while it is off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from nvdaemon.configload import parse_config
from tests.deploy import helm
from tests.deploy.helm import CHART, agent, mounts, notes, pod_spec, render
from tests.deploy.matrix import ALL_TIERS

ON: dict[str, Any] = {**ALL_TIERS, "dcgmCompat": {"enabled": True, "podAttribution": True}}
DIR = "/var/lib/kubelet/pod-resources"


def test_gpu_pod_mounts_the_directory_read_only_and_runs_as_root_without_capabilities() -> None:
    rendered = render(ON)
    sets = rendered.daemonsets()
    gpu = sets["gpu"]
    m = mounts(gpu)[DIR]
    assert m["readOnly"] is True and m["volume"]["hostPath"] == {"path": DIR, "type": "Directory"}
    text, config = rendered.config_of(gpu)
    assert config["dcgmCompat"] == {
        "enabled": True,
        "podAttribution": True,
        "podResourcesSocket": f"{DIR}/kubelet.sock",
    }
    parse_config(text, "rendered.yaml", env={"WEBHOOK_SECRET_0": "x"})  # the agent takes it
    sc = agent(gpu)["securityContext"]
    assert (sc["runAsUser"], sc["allowPrivilegeEscalation"], sc["capabilities"]) == (0, False, {"drop": ["ALL"]})
    assert not pod_spec(gpu).get("initContainers"), "root owns the state directory: no chown"
    for tier in ("core", "smart"):  # only the gpu pod reads the kubelet
        assert DIR not in mounts(sets[tier])
        assert "podAttribution" not in rendered.config_of(sets[tier])[1].get("dcgmCompat", {})
    for doc in rendered.docs:
        if doc["kind"] == "DaemonSet":
            kubernetes_validate.validate(doc, helm.KUBERNETES_VERSION, strict=True)


def test_single_pod_mounts_it_too() -> None:
    pod = render({**ON, "singlePod": True}).daemonsets()["agent"]
    assert mounts(pod)[DIR]["readOnly"] is True


def test_socket_group_keeps_uid_65532_and_selinux_type_is_set_when_asked() -> None:
    values = {**ON, "dcgmCompat": {**ON["dcgmCompat"], "podResourcesGroup": 2000, "podResourcesSeLinuxType": "spc_t"}}
    gpu = render(values).daemonsets()["gpu"]
    assert pod_spec(gpu)["securityContext"]["supplementalGroups"] == [2000]
    sc = agent(gpu)["securityContext"]
    assert sc["runAsUser"] == 65532 and sc["seLinuxOptions"] == {"type": "spc_t"}
    kubernetes_validate.validate(gpu, helm.KUBERNETES_VERSION, strict=True)


def test_off_by_default_changes_nothing() -> None:
    assert (
        render({**ALL_TIERS, "dcgmCompat": {"enabled": True}}).text
        == render(
            {**ALL_TIERS, "dcgmCompat": {"enabled": True, "podAttribution": False, "podResourcesGroup": 2000}}
        ).text
    )
    gpu = render(ALL_TIERS).daemonsets()["gpu"]
    assert DIR not in mounts(gpu) and agent(gpu)["securityContext"]["runAsUser"] == 65532


@pytest.mark.parametrize("bad", [{"podResourcesGroup": 0}, {"podResourcesHostPath": "relative"}, {"podAtribution": 1}])
def test_schema_rejects(bad: dict[str, Any], tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps({"dcgmCompat": {"enabled": True, **bad}}))
    proc = helm.run_helm("lint", "--strict", str(CHART), "-f", str(values))
    assert proc.returncode != 0


def test_notes_say_how_to_check(tmp_path: Path) -> None:
    text = notes(tmp_path, ON)
    assert "nodevitals_podresources_up" in text and "uid 0 with every capability dropped" in text
    assert "pod-resources directory (hostPath) and\n    runs as uid 0: privileged namespace" in text
    assert "nodevitals_podresources_up" not in notes(tmp_path / "off", ALL_TIERS)
