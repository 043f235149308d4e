"""``promtool test rules`` on the chart's PrometheusRule as shipped (default ``for:``, thresholds and windows, the
opt-in hardware group on): tests/stack/rules/*.test.yaml hold the input series and the alerts expected at given
times. Also: every shipped alert has a unit test, the hardware group is opt-in, ``forOverride`` (testing only)
replaces every ``for:``, and ``taskRestartWindow`` sets NvdaemonTaskRestarting's window."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import helm

RULE_TESTS = Path(__file__).parent / "rules"


def rule_groups(values: dict[str, Any]) -> list[dict[str, Any]]:
    """spec.groups of the chart's PrometheusRule rendered by the real helm with ``values`` under prometheusRule."""
    (rule,) = helm.render({"prometheusRule": {"enabled": True, **values}}).kind("PrometheusRule")
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"]}


def test_promtool_rule_unit_tests(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool not found (Debian package prometheus; make test installs it as root): alert unit tests not run"
        )
    groups = rule_groups({"hardware": {"enabled": True}})
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    files = sorted(RULE_TESTS.glob("*.test.yaml"))
    for f in files:
        shutil.copy(f, tmp_path / f.name)
    proc = subprocess.run(
        [promtool, "test", "rules", *(f.name for f in files)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(files) == 2, proc.stdout


def test_every_shipped_alert_has_a_unit_test_that_sees_it_fire() -> None:
    shipped = set(alerts(rule_groups({"hardware": {"enabled": True}})))
    firing: set[str] = set()
    for f in RULE_TESTS.glob("*.test.yaml"):
        for case in yaml.safe_load(f.read_text())["tests"]:
            firing |= {t["alertname"] for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert shipped - firing == set(), "alerts without a promtool test that expects them firing"
    assert firing - shipped == set(), "promtool tests for alerts the chart does not ship"


def test_hardware_alerts_are_opt_in_and_use_the_go_contract_names() -> None:
    default = rule_groups({})
    assert [g["name"] for g in default] == ["nvdaemon.agent"]
    hw = rule_groups({"hardware": {"enabled": True, "nvmeWearPercent": 80, "errorWindow": "2h"}})
    assert [g["name"] for g in hw] == ["nvdaemon.agent", "nvdaemon.hardware"]
    rules = alerts(hw)
    assert rules["NvdaemonNvmeWearHigh"]["expr"] == "nodevitals_hw_nvme_percentage_used > 80"
    assert "[2h]" in rules["NvdaemonPcieAerFatal"]["expr"] and "[2h]" in rules["NvdaemonGpuEccUncorrected"]["expr"]
    assert 'error_type="TOTAL_ERR_FATAL"' in rules["NvdaemonPcieAerFatal"]["expr"]


def test_for_override_replaces_every_for_and_defaults_stay_otherwise() -> None:
    shipped = alerts(rule_groups({"hardware": {"enabled": True}}))
    assert shipped["NvdaemonCollectorFailing"]["for"] == "15m" and shipped["NvdaemonAgentDown"]["for"] == "10m"
    assert "for" not in shipped["NvdaemonTaskRestarting"]  # fires at once by design
    short = alerts(rule_groups({"hardware": {"enabled": True}, "forOverride": "1s"}))
    assert set(short) == set(shipped)
    assert {name: r["for"] for name, r in short.items()} == dict.fromkeys(short, "1s")


def test_task_restart_window_is_a_value_defaulting_to_15m() -> None:
    expr = "increase(nodevitals_task_restarts_total[{}]) > 3"
    shipped = alerts(rule_groups({}))["NvdaemonTaskRestarting"]
    assert shipped["expr"] == expr.format("15m")
    short = alerts(rule_groups({"taskRestartWindow": "20s"}))["NvdaemonTaskRestarting"]
    assert short["expr"] == expr.format("20s")
    assert "more than 3 times in 20s;" in short["annotations"]["description"]


@pytest.mark.parametrize(
    "values",
    [
        {"forOverride": "soon"},
        {"taskRestartWindow": "15 minutes"},
        {"taskRestartWindow": ""},
        {"hardware": {"enabeld": True}},
        {"hardware": {"nvmeWearPercent": "ninety"}},
    ],
)
def test_schema_rejects_bad_prometheus_rule_values(values: dict[str, Any]) -> None:
    with pytest.raises(helm.RenderError, match=re.compile("schema|values", re.I)):
        rule_groups(values)
