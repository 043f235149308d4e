"""deploy/grafana/nvdaemon-hardware.json: loads, every query is valid PromQL (promtool), and every metric it or the
chart's alerts name is one the agent exports (hardware metrics from the catalogue, self metrics from the source)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvdaemon.catalogue import HELP
from tests.deploy import helm

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "nvdaemon-hardware.json"
SOURCE = "\n".join(p.read_text() for p in (ROOT / "nvdaemon").rglob("*.py"))
_METRIC = re.compile(r"\b((?:nodevitals|nvsentinel)_[a-z0-9_]+)")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def _exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in _panels(dash) for t in p.get("targets", [])]


def test_dashboard_structure() -> None:
    dash = json.loads(DASHBOARD.read_text())
    panels = _panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    assert dash["uid"] and dash["title"]
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "node"}
    for p in panels:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}"
            assert p["targets"], p["title"]
            assert p["gridPos"]["w"] <= 24


def _exported(name: str) -> bool:
    if name.startswith("nodevitals_hw_"):
        return name.removeprefix("nodevitals_hw_") in HELP
    base = name
    for suffix in _SUFFIXES:
        base = base.removesuffix(suffix)
    return re.search(rf"\b{re.escape(base)}\b", SOURCE) is not None  # the name itself, not a longer one


def test_every_metric_named_is_exported() -> None:
    (rule,) = helm.render({"prometheusRule": {"enabled": True}}).kind("PrometheusRule")  # skips without helm
    alert_exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    names = {m for e in _exprs() + alert_exprs for m in _METRIC.findall(e)}
    assert any(n.startswith("nodevitals_hw_gpu_") for n in names) and any(
        n.startswith("nodevitals_hw_smart_") for n in names
    )
    missing = sorted(n for n in names if not _exported(n))
    assert not missing, f"named in the dashboard or alerts, exported by no code: {missing}"


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not found (Debian package prometheus): dashboard queries not checked")
    rules = []
    for i, expr in enumerate(_exprs()):
        concrete = expr.replace("$__rate_interval", "5m").replace("$node", ".*")
        rules.append({"record": f"dashboard:query_{i}", "expr": concrete})
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
