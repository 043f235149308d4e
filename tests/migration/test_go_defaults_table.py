"""Every chart default that differs from the Go chart's has a row in the "Migrating from nodevitals" table
(docs/migration.md), and what the row says holds on the rendered chart: the rolling update's ``maxUnavailable``
(10 % here, 1 in Go, where a copied Go values file keeps its 1) and the gpu tier's Pod Security level (Go's is
Restricted; ours needs ``privileged`` for the state hostPath, and is Restricted with ``stateDir.enabled=false``)."""

from __future__ import annotations

import re

from tests.deploy.helm import pod_spec, render
from tests.deploy.psa import baseline_violations, restricted_violations
from tests.migration.test_go_release_names import go_file
from tests.test_e2e import ROOT

GPU_ONLY = {"tiers": {"core": {"enabled": False}, "gpu": {"enabled": True}}}


def migration_rows() -> dict[str, list[str]]:
    """The migration tables' rows, by their first cell."""
    text = (ROOT / "docs" / "migration.md").read_text()
    section = text.split("# Migrating from nodevitals", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| ") and not re.match(r"\|[-|]+\|$", line):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0]] = cells[1:]
    return rows


def test_max_unavailable_row_and_rendering() -> None:
    row = migration_rows()["`updateStrategy` without a values file"]
    assert row[0] == "`maxUnavailable: 1`"
    assert "`rollingUpdate.maxUnavailable: 10%`" in row[1] and "used as given" in row[1]
    ours = render().daemonsets()["core"]["spec"]["updateStrategy"]
    assert ours == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}}
    gos = render(go_file()).daemonsets()["core"]["spec"]["updateStrategy"]
    assert gos == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


def test_gpu_pod_security_row_and_rendering() -> None:
    row = migration_rows()["gpu tier Pod Security"]
    assert row[0] == "Restricted (no hostPath)"
    assert "`privileged`" in row[1] and "`stateDir.enabled=false`" in row[1]
    gpu = pod_spec(render(GPU_ONLY).daemonsets()["gpu"])
    assert "hostPathVolumes" in baseline_violations(gpu)  # not even Baseline: the state hostPath
    assert {v["hostPath"]["path"] for v in gpu["volumes"] if "hostPath" in v} == {"/var/lib/nvdaemon/gpu"}
    without_state = pod_spec(render({**GPU_ONLY, "stateDir": {"enabled": False}}).daemonsets()["gpu"])
    assert restricted_violations(without_state) == set()


def test_names_and_listening_rows_are_there() -> None:
    rows = migration_rows()
    assert "goNames" in rows["Helm names"][0]
    assert '`listenAddr: ":9847"`' in rows["listening"][0]
    assert "goNames: true" in rows["chart names for another release name"][1]
