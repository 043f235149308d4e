"""The Go chart's names, labels and selectors, so that ``helm upgrade`` of a Go release works in place.

``go_resources`` is what the Go chart (nodevitals 0.8.6) renders for a values file: each resource's kind and name
(fixed, whatever the release is called) and the fields the API server refuses to change in place, a DaemonSet's
``spec.selector`` and a headless Service's ``clusterIP``. These are facts read from that chart's templates. ``helm
upgrade`` of a Go release patches every resource that has the same kind and name in both manifests, creates the new
ones and deletes the ones we no longer render. A patch that changes an immutable field fails, and then the whole
upgrade fails. So for each Go resource, our chart (``goNames`` on: ``auto`` for a release named ``nodevitals``, as
the Go quickstart names it, or ``true``) must render the same kind and name with the same immutable fields, and its
pod template labels must still match the selector.

No API server can run here, so the upgrade itself is not run. These tests check the rendered manifests that the
upgrade depends on. docs/migration.md ("Migrating from nodevitals") gives the steps and what each one does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import helm
from tests.deploy.helm import Doc, Rendered, notes, render
from tests.deploy.matrix import GO_VALUES

GO_NAME = {"app.kubernetes.io/name": "nodevitals"}


def go_resources(values: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> the immutable fields the Go chart 0.8.6 renders for ``values`` (its defaults filled in)."""
    tiers = [t for t in ("core", "smart", "gpu") if values.get("tiers", {}).get(t, {}).get("enabled", t == "core")]
    out: dict[tuple[str, str], dict[str, Any]] = {}
    groups = [("nodevitals", "single")] if values.get("singlePod") else [(f"nodevitals-{t}", t) for t in tiers]
    for name, component in groups:
        out[("DaemonSet", name)] = {"selector": {"matchLabels": {**GO_NAME, "app.kubernetes.io/component": component}}}
        out[("ConfigMap", name)] = {"keys": {"config.yaml"}}  # what a Go pod reads at /etc/nodevitals
    secrets = [i for i, hook in enumerate(values.get("webhooks") or []) if hook.get("secret")]
    if secrets:
        out[("Secret", "nodevitals-webhooks")] = {"keys": {f"secret-{i}" for i in secrets}}
    if values.get("serviceMonitor", {}).get("enabled"):
        out[("Service", "nodevitals-metrics")] = {"clusterIP": "None", "selector": GO_NAME}
        out[("ServiceMonitor", "nodevitals")] = {}
    return out


def go_file(**over: Any) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(GO_VALUES.read_text()) or {}
    return helm.deep_merge(values, over)


ALL_ON = {"tiers": {"core": {"enabled": True}, "smart": {"enabled": True}, "gpu": {"enabled": True}}}
HOOKS = {"webhooks": [{"url": "https://a.example/h", "secret": "whsec_MTIz"}, {"url": "https://b.example/h"}]}
VARIANTS: dict[str, dict[str, Any]] = {
    "go file": go_file(),
    "quickstart defaults": {},
    "every tier, webhooks, ServiceMonitor": go_file(**ALL_ON, **HOOKS, serviceMonitor={"enabled": True}),
    "singlePod": go_file(**ALL_ON, **HOOKS, singlePod=True),
}
# (release, goNames set): the quickstart's release name with the default, any release name with goNames=true
RELEASES = [("nodevitals", None), ("telemetry", True)]


def rendered(values: dict[str, Any], release: str, go_names: bool | None) -> Rendered:
    return render(values if go_names is None else {**values, "goNames": go_names}, release=release)


def by_key(r: Rendered) -> dict[tuple[str, str], Doc]:
    return {(d["kind"], d["metadata"]["name"]): d for d in r.docs}


@pytest.mark.parametrize(("release", "go_names"), RELEASES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_go_resource_is_rendered_with_its_immutable_fields(
    variant: str, release: str, go_names: bool | None
) -> None:
    values = VARIANTS[variant]
    ours = by_key(rendered(values, release, go_names))
    expected = go_resources(values)
    assert expected, variant
    for (kind, name), fields in expected.items():
        assert (kind, name) in ours, f"{variant}: the Go release's {kind}/{name} is not rendered (upgrade deletes it)"
        doc = ours[(kind, name)]
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "nodevitals"
        if kind == "DaemonSet":
            assert doc["spec"]["selector"] == fields["selector"], f"{name}: selector differs (immutable)"
            template = doc["spec"]["template"]["metadata"]["labels"]
            assert fields["selector"]["matchLabels"].items() <= template.items()
        if kind == "Service":
            assert doc["spec"]["clusterIP"] == fields["clusterIP"]
            assert doc["spec"]["selector"] == fields["selector"]
        if kind in ("Secret", "ConfigMap"):
            assert fields["keys"] <= set(doc["data"]), "a Go pod restarting mid-rollout must find its key"
    # our DaemonSets are exactly the Go release's: none created beside them (two pods per node on one host port)
    assert {k for k in ours if k[0] == "DaemonSet"} == {k for k in expected if k[0] == "DaemonSet"}


@pytest.mark.parametrize(("release", "go_names"), RELEASES)
def test_the_pods_read_their_secrets_under_the_go_keys(release: str, go_names: bool | None) -> None:
    r = rendered(VARIANTS["every tier, webhooks, ServiceMonitor"], release, go_names)
    for ds in r.kind("DaemonSet"):
        env = {e["name"]: e for e in helm.agent(ds)["env"]}
        ref = env["WEBHOOK_SECRET_0"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "nodevitals-webhooks", "key": "secret-0"}
        assert "WEBHOOK_SECRET_1" not in env  # no secret, no variable (as in Go)
    assert r.secret_data()["nodevitals-webhooks/secret-0"] == "whsec_MTIz"


@pytest.mark.parametrize(("release", "go_names"), RELEASES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_go_named_manifests_are_valid_kubernetes(variant: str, release: str, go_names: bool | None) -> None:
    for doc in rendered(VARIANTS[variant], release, go_names).docs:
        if doc["kind"] != "ServiceMonitor":  # a CRD: not in kubernetes-validate's bundled schemas
            helm.assert_valid_kubernetes(doc, variant)


def test_the_go_quickstart_unchanged_gives_the_go_readmes_daemonset() -> None:
    """`helm install nodevitals ./deploy/chart`, then the Go README's `kubectl get daemonset nodevitals-core`."""
    r = render({}, release="nodevitals")
    ds = r.get("DaemonSet", "nodevitals-core")
    assert ds["metadata"]["labels"]["app.kubernetes.io/instance"] == "nodevitals"  # not a selector, still a label
    # the Go NOTES' check: kubectl get daemonset -l app.kubernetes.io/name=nodevitals
    assert [d["metadata"]["name"] for d in r.kind("DaemonSet") if d["metadata"]["labels"].items() >= GO_NAME.items()]


def test_other_releases_keep_release_prefixed_names_and_instance_selectors() -> None:
    for release, values in [("nv", {}), ("nodevitals", {"goNames": False})]:
        ds = render(values, release=release).daemonsets()["core"]
        assert ds["metadata"]["name"] == f"{release}-nvdaemon-core"
        assert ds["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "nvdaemon",
            "app.kubernetes.io/instance": release,
            "app.kubernetes.io/component": "core",
        }


def test_go_names_win_over_the_name_overrides() -> None:
    r = render({"goNames": True, "nameOverride": "x", "fullnameOverride": "y"}, release="nv")
    assert [d["metadata"]["name"] for d in r.kind("DaemonSet")] == ["nodevitals-core"]


def test_the_schema_refuses_a_go_names_typo() -> None:
    with pytest.raises(helm.RenderError, match="goNames"):
        render({"goNames": "yes"})


def test_notes_say_which_names_and_give_the_flag(tmp_path: Path) -> None:
    go = notes(tmp_path / "go", {}, release="nodevitals")
    assert "Names and selectors are the Go chart's (goNames: auto, the release is named nodevitals)" in go
    assert "kubectl get daemonset -l app.kubernetes.io/name=nodevitals" in go
    ours = notes(tmp_path / "ours", {})
    assert "--set goNames=true" in ours
    assert "DaemonSet nv-nvdaemon-core" in ours
