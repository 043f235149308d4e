"""Config checks of the NVSentinel settings that a type cannot express, run on the raw tree by ``configload``.

Kept apart from ``map`` so that loading a config does not import the sink's mapping (and through it the
engine and the GPU package). Like every validator it may import ``config``; ``config`` never imports it.
"""

from __future__ import annotations

import re
from typing import Any

from nvdaemon.configcheck import ConfigIssue

CHECK_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")


def normalise_xid_keys(raw: dict[str, Any]) -> None:
    """``xidActions: {79: RESTART_BM}``: YAML reads 79 as an int; the config keys are strings."""
    sinks = raw.get("sinks")
    nvs = sinks.get("nvsentinel") if isinstance(sinks, dict) else None
    if not isinstance(nvs, dict):
        return
    actions = nvs.get("xidActions")
    if isinstance(actions, dict):
        nvs["xidActions"] = {
            str(k) if isinstance(k, int) and not isinstance(k, bool) else k: v for k, v in actions.items()
        }


def nvsentinel_issues(raw: dict[str, Any]) -> list[ConfigIssue]:
    issues: list[ConfigIssue] = []
    rules = raw.get("rules")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        block = rule.get("nvsentinel") if isinstance(rule, dict) else None
        if not isinstance(block, dict):
            continue
        path = f"rules[{i}].nvsentinel"
        name = block.get("checkName")
        if isinstance(name, str) and name and not CHECK_NAME.fullmatch(name):
            issues.append(ConfigIssue(f"{path}.checkName", "expected a name of letters and digits (a node condition)"))
        custom = block.get("customRecommendedAction")
        if block.get("recommendedAction") == "CUSTOM" and not (isinstance(custom, str) and custom.strip()):
            issues.append(ConfigIssue(f"{path}.customRecommendedAction", "required when recommendedAction is CUSTOM"))
        if isinstance(custom, str) and custom and block.get("recommendedAction") != "CUSTOM":
            issues.append(ConfigIssue(f"{path}.customRecommendedAction", "only used with recommendedAction CUSTOM"))
    sinks = raw.get("sinks")
    nvs = sinks.get("nvsentinel") if isinstance(sinks, dict) else None
    actions = nvs.get("xidActions") if isinstance(nvs, dict) else None
    if isinstance(actions, dict):
        for key, action in actions.items():
            if isinstance(key, str) and not key.isdigit():
                issues.append(ConfigIssue(f"sinks.nvsentinel.xidActions.{key}", "expected an XID number as the key"))
            if action == "CUSTOM":
                issues.append(
                    ConfigIssue(f"sinks.nvsentinel.xidActions.{key}", "CUSTOM is not available for XIDs (no text)")
                )
    return issues
