"""docs/runbooks.md against the chart's PrometheusRule: every alert's ``runbook_url`` is
``prometheusRule.runbookBaseUrl`` + ``#`` + the GitHub anchor of a section headed with the alert's name; every such
section says what the alert means, how to confirm it and what to do; no section is left for an alert the chart does
not ship; and every metric the page names is one the agent exports (hardware metrics from the catalogue, self
metrics from the source, as the dashboard test checks them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from nvdaemon.catalogue import HELP
from tests.deploy import helm
from tests.markdown import github_anchor, without_fences

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"
TEMPLATE = ROOT / "deploy" / "chart" / "templates" / "prometheusrule.yaml"
VALUES = ROOT / "deploy" / "chart" / "values.yaml"
CHART_YAML = ROOT / "deploy" / "chart" / "Chart.yaml"
SOURCE = "\n".join(p.read_text() for p in (ROOT / "nvdaemon").rglob("*.py"))

ALL_GROUPS = {"prometheusRule": {"enabled": True, "hardware": {"enabled": True}}}
PARTS = ("Meaning", "Confirm", "Act")
_METRIC = re.compile(r"\b((?:nodevitals|nvsentinel)_[a-z0-9_]*[a-z0-9])")
_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def sections() -> dict[str, str]:
    """The page's ``## `` sections, heading -> body; fenced code is blanked first so a shell comment is no heading."""
    text = without_fences(RUNBOOKS.read_text())
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    headings = parts[1::2]
    assert len(headings) == len(set(headings)), f"repeated headings: {headings}"
    return dict(zip(headings, parts[2::2], strict=True))


def template_alerts() -> list[str]:
    """Every alert the chart's template can render (both groups), by name, in file order."""
    return re.findall(r"^\s*- alert: (\w+)\s*$", TEMPLATE.read_text(), flags=re.M)


def rendered_rules(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (rule,) = helm.render(values).kind("PrometheusRule")  # skips without helm
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def default_base() -> str:
    base: str = yaml.safe_load(VALUES.read_text())["prometheusRule"]["runbookBaseUrl"]
    return base


def parts_of(body: str) -> dict[str, str]:
    """``**Meaning**``, ``**Confirm**``, ``**Act**`` of a section -> the text up to the next part (empty if absent)."""
    found = re.split(r"^\*\*(Meaning|Confirm|Act)\*\*", body, flags=re.M)
    names = found[1::2]
    assert names == list(PARTS), f"parts {names}, expected {list(PARTS)} in this order"
    return dict(zip(names, found[2::2], strict=True))


def exported(name: str) -> bool:
    """A hardware metric is in the catalogue; any other name (self metrics, NVSentinel's publisher names) is a family
    name the source declares as a string literal, with or without its exposition suffix."""
    if name.startswith("nodevitals_hw_"):
        return name.removeprefix("nodevitals_hw_") in HELP
    bases = {name} | {name.removesuffix(s) for s in _SUFFIXES if name.endswith(s)}
    return any(f'"{b}"' in SOURCE for b in bases)


# ---- the anchor rule ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("NvdaemonAgentDown", "nvdaemonagentdown"),
        ("In-place `helm upgrade` of a Go release", "in-place-helm-upgrade-of-a-go-release"),
        ("node_exporter drop-in", "node_exporter-drop-in"),
        ("Reaching the agent: port 9847, /v1/status", "reaching-the-agent-port-9847-v1status"),
    ],
)
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


# ---- the chart's links ----------------------------------------------------------------------------------------------
def test_every_alert_links_its_section() -> None:
    rules = rendered_rules(ALL_GROUPS)
    assert sorted(rules) == sorted(template_alerts()), "both groups rendered: every alert of the template"
    unlinked = sorted(n for n, r in rules.items() if "runbook_url" not in r["annotations"])
    assert not unlinked, f"alerts without a runbook_url: {unlinked}"
    base = default_base()
    anchors = {github_anchor(h) for h in sections()}
    wrong = {}
    for name, rule in rules.items():
        url = rule["annotations"]["runbook_url"]
        if url != f"{base}#{github_anchor(name)}":
            wrong[name] = url
    assert not wrong, f"runbook_url is not {base}#<anchor of the alert's section>: {wrong}"
    unresolved = sorted(n for n, r in rules.items() if r["annotations"]["runbook_url"].partition("#")[2] not in anchors)
    assert not unresolved, f"runbook_url fragments with no heading in {RUNBOOKS.name}: {unresolved}"


def test_default_base_is_this_page_in_the_project_repository() -> None:
    home = yaml.safe_load(CHART_YAML.read_text())["home"]
    assert default_base() == f"{home}/blob/main/{RUNBOOKS.relative_to(ROOT).as_posix()}"


def test_a_custom_base_url_is_used() -> None:
    base = "https://wiki.example/ops/nvdaemon-runbooks"
    rules = rendered_rules(helm.deep_merge(ALL_GROUPS, {"prometheusRule": {"runbookBaseUrl": base}}))
    assert {n: r["annotations"]["runbook_url"] for n, r in rules.items()} == {
        n: f"{base}#{n.lower()}" for n in template_alerts()
    }


@pytest.mark.parametrize("bad", ["wiki.example/runbooks", "https://wiki.example/runbooks#section", ""])
def test_the_schema_refuses_a_base_that_is_not_a_url_without_fragment(bad: str) -> None:
    with pytest.raises(helm.RenderError, match="runbookBaseUrl"):
        helm.render(helm.deep_merge(ALL_GROUPS, {"prometheusRule": {"runbookBaseUrl": bad}}))


# ---- the page -------------------------------------------------------------------------------------------------------
def test_sections_match_the_alerts_shipped() -> None:
    """Both directions: a section for every alert, and no alert-named section the chart does not ship (a renamed or
    removed alert leaves none behind)."""
    alert_sections = {h for h in sections() if h.startswith("Nvdaemon")}
    shipped = set(template_alerts())
    assert len(shipped) == len(template_alerts())
    unshipped = sorted(alert_sections - shipped)
    assert not shipped - alert_sections, f"alerts without a section: {sorted(shipped - alert_sections)}"
    assert not unshipped, f"sections for alerts the chart does not ship: {unshipped}"


@pytest.mark.parametrize("alert", template_alerts())
def test_each_section_says_meaning_confirm_act(alert: str) -> None:
    body = sections()[alert]
    parts = parts_of(body)
    for part, text in parts.items():
        assert len(text.strip(" :\n")) > 40, f"{alert}: {part} is empty"
    assert "`" in parts["Confirm"], f"{alert}: Confirm names no metric, endpoint or command"


def test_in_page_links_resolve() -> None:
    anchors = {github_anchor(h) for h in sections()}
    links = set(re.findall(r"\]\(#([^)]+)\)", RUNBOOKS.read_text()))
    assert links, "the page links its related sections"
    assert not links - anchors, f"links to no heading: {sorted(links - anchors)}"


def test_every_metric_named_is_exported() -> None:
    names = set(_METRIC.findall(RUNBOOKS.read_text()))
    assert any(n.startswith("nodevitals_hw_") for n in names) and any(n.startswith("nvsentinel_") for n in names)
    missing = sorted(n for n in names if not exported(n))
    assert not missing, f"named in {RUNBOOKS.name}, exported by no code: {missing}"


def test_each_section_confirms_on_its_alerts_own_series() -> None:
    """Every metric an alert's expression reads is named in that alert's Meaning or Confirm part."""
    rules = rendered_rules(ALL_GROUPS)
    pages = sections()
    gaps = {}
    for name, rule in rules.items():
        confirm = parts_of(pages[name])["Confirm"] + parts_of(pages[name])["Meaning"]
        lacking = set(_METRIC.findall(rule["expr"])) - set(_METRIC.findall(confirm))
        if lacking:
            gaps[name] = sorted(lacking)
    assert not gaps, f"series the alert reads that its Meaning/Confirm never names: {gaps}"
