"""Pods that send to NVSentinel get the memory their shape measured (grpcio for the call: up to 78 MiB in `make
bench`, where every other shape stays under 64 MiB): ``nvsentinel.resources`` is merged over ``resources`` for them,
and NOTES warns at a limit under 80Mi instead of 64Mi."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.deploy.helm import agent, notes, render

GPU: dict[str, Any] = {"tiers": {"gpu": {"enabled": True}}}
NVSENTINEL: dict[str, Any] = {**GPU, "nvsentinel": {"enabled": True}}


def memory(values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each DaemonSet's agent container memory (requests, limits), by component."""
    out = {}
    for component, ds in render(values).daemonsets().items():
        res = agent(ds)["resources"]
        out[component] = {"requests": res["requests"]["memory"], "limits": res["limits"]["memory"]}
    return out


def test_without_nvsentinel_the_chart_resources_are_used() -> None:
    assert memory(GPU) == {c: {"requests": "64Mi", "limits": "128Mi"} for c in ("core", "gpu")}


def test_with_nvsentinel_the_request_covers_its_peak() -> None:
    assert memory(NVSENTINEL) == {c: {"requests": "80Mi", "limits": "128Mi"} for c in ("core", "gpu")}
    own = memory({**NVSENTINEL, "nvsentinel": {"enabled": True, "resources": {"limits": {"memory": "256Mi"}}}})
    assert own["gpu"] == {"requests": "80Mi", "limits": "256Mi"}  # merged, key by key
    assert render(NVSENTINEL).docs == render(NVSENTINEL).docs  # the values themselves are not changed by the merge


def test_notes_warn_under_the_nvsentinel_floor(tmp_path: Path) -> None:
    low = {"resources": {"limits": {"memory": "72Mi"}}}
    assert "WARNING: resources.limits.memory" not in notes(tmp_path / "a", {**GPU, **low})
    text = notes(tmp_path / "b", {**NVSENTINEL, **low})
    assert "WARNING: resources.limits.memory is 72Mi" in text
    assert "78 MiB with NVSentinel" in text and "a limit under 80Mi risks OOM kills" in text
