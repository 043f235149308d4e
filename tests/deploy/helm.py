"""Render the chart with a real helm (scripts/fetch-helm puts v3.19.0 in .tools/helm; else helm on PATH)."""

from __future__ import annotations

import base64
import functools
import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "chart"
NAMESPACE = "nvdaemon-system"
RELEASE = "nv"
KUBERNETES_VERSION = "1.30.0"  # kubernetes-validate bundles its schemas: validation needs no network

Doc = dict[str, Any]


def helm_path() -> str | None:
    local = ROOT / ".tools" / "helm"
    if local.is_file():
        return str(local)
    return shutil.which("helm")


def require_helm() -> str:
    helm = helm_path()
    if helm is None:
        pytest.skip("helm not found: run scripts/fetch-helm (puts helm v3.19.0 in .tools/helm) or put helm on PATH")
    return helm


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_helm(), *args], capture_output=True, text=True, timeout=60, check=False)


@functools.lru_cache(maxsize=64)
def _render(values_json: str, release: str) -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(values_json)  # JSON is YAML
        f.flush()
        proc = run_helm("template", release, str(CHART), "--namespace", NAMESPACE, "-f", f.name)
    if proc.returncode != 0:
        raise RenderError(proc.stderr)
    return proc.stdout


class RenderError(Exception):
    pass


@dataclass(frozen=True)
class Rendered:
    text: str
    docs: list[Doc]

    def kind(self, kind: str) -> list[Doc]:
        return [d for d in self.docs if d["kind"] == kind]

    def get(self, kind: str, name: str) -> Doc:
        found = [d for d in self.kind(kind) if d["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} found among {[d['metadata']['name'] for d in self.docs]}"
        return found[0]

    def daemonsets(self) -> dict[str, Doc]:
        """DaemonSets by the app.kubernetes.io/component label (core, smart, gpu; agent with singlePod)."""
        return {d["metadata"]["labels"]["app.kubernetes.io/component"]: d for d in self.kind("DaemonSet")}

    def config_of(self, ds: Doc) -> tuple[str, dict[str, Any]]:
        """The config.yaml text the DaemonSet's pods mount, and its parsed form."""
        volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        cm = self.get("ConfigMap", volumes["config"]["configMap"]["name"])
        text = cm["data"]["config.yaml"]
        return text, yaml.safe_load(text)

    def secret_data(self) -> dict[str, str]:
        """Every key of every rendered Secret, decoded, as name/key."""
        out: dict[str, str] = {}
        for s in self.kind("Secret"):
            for key, value in (s.get("data") or {}).items():
                out[f"{s['metadata']['name']}/{key}"] = base64.b64decode(value).decode()
        return out


def render(values: dict[str, Any] | None = None, release: str = RELEASE) -> Rendered:
    text = _render(json.dumps(values or {}, sort_keys=True), release)
    docs = [d for d in yaml.safe_load_all(text) if d]
    return Rendered(text, docs)


def pod_spec(ds: Doc) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def agent(ds: Doc) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in pod_spec(ds)["containers"] if c["name"] == "nvdaemon"]
    (container,) = found
    return container


def mounts(ds: Doc) -> dict[str, dict[str, Any]]:
    """The agent container's mounts by mount path, each with its volume under "volume"."""
    volumes = {v["name"]: v for v in pod_spec(ds)["volumes"]}
    return {m["mountPath"]: {**m, "volume": volumes[m["name"]]} for m in agent(ds).get("volumeMounts", [])}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def notes(tmp_path: Path, values: dict[str, Any], release: str = RELEASE) -> str:
    """NOTES.txt as helm renders it (helm template skips NOTES and `install --dry-run` wants a cluster): a copy of the
    chart renders it through `tpl` into a ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    (chart / "notes.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  notes: |\n    {{- tpl (.Files.Get "notes.txt") . | nindent 4 }}\n'
    )
    (chart / "values.override.yaml").write_text(json.dumps(values))
    proc = run_helm(
        "template",
        release,
        str(chart),
        "--namespace",
        NAMESPACE,
        "-f",
        str(chart / "values.override.yaml"),
        "--show-only",
        "templates/zz-notes.yaml",
    )
    assert proc.returncode == 0, proc.stderr
    text: str = yaml.safe_load(proc.stdout)["data"]["notes"]
    return text


def assert_valid_kubernetes(doc: Doc, label: str) -> None:
    """``doc`` passes kubernetes-validate's strict schema of KUBERNETES_VERSION (CRDs such as the ServiceMonitor and
    PrometheusRule are not in its bundled schemas: the caller leaves them out)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{label}: {doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")
