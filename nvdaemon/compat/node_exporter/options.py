"""The node_exporter collectors we implement, with node_exporter's own defaults, and the config checks for them.

Kept apart from the collector modules so that validating a config never imports them.
"""

from __future__ import annotations

import re
from typing import Any

from nvdaemon.configcheck import ConfigIssue

# node_exporter collector name -> enabled by default (node_exporter 1.5's defaults).
DEFAULTS: dict[str, bool] = {
    "conntrack": True,
    "cpu": True,
    "cpufreq": True,
    "diskstats": True,
    "edac": True,
    "entropy": True,
    "filefd": True,
    "filesystem": True,
    "hwmon": True,
    "infiniband": True,
    "loadavg": True,
    "mdadm": True,
    "meminfo": True,
    "netclass": True,
    "netdev": True,
    "netstat": True,
    "nvme": True,
    "os": True,
    "powersupplyclass": True,
    "pressure": True,
    "rapl": True,
    "schedstat": True,
    "sockstat": True,
    "softnet": True,
    "stat": True,
    "textfile": True,
    "thermal_zone": True,
    "time": True,
    "uname": True,
    "vmstat": True,
}

_REGEX_KEYS = {
    "diskstats": ("deviceInclude", "deviceExclude"),
    "filesystem": ("mountPointsExclude", "fsTypesExclude"),
    "netdev": ("deviceInclude", "deviceExclude"),
    "hwmon": ("chipInclude", "chipExclude"),
}


def compile_filter(pattern: str) -> re.Pattern[str] | None:
    """A node_exporter filter regexp: unanchored search, ASCII classes (as Go's RE2); "" means no filter."""
    return re.compile(pattern, re.ASCII) if pattern else None


def filtered_out(name: str, include: re.Pattern[str] | None, exclude: re.Pattern[str] | None) -> bool:
    """node_exporter's device filter: dropped when the exclude pattern matches or an include pattern does not."""
    return (exclude is not None and exclude.search(name) is not None) or (
        include is not None and include.search(name) is None
    )


def node_exporter_issues(raw: dict[str, Any]) -> list[ConfigIssue]:
    """Unknown collector names and regular expressions that do not compile."""
    issues: list[ConfigIssue] = []
    collectors = raw.get("collectors")
    if isinstance(collectors, dict):
        for name in collectors:
            if name not in DEFAULTS:
                known = ", ".join(sorted(DEFAULTS))
                issues.append(
                    ConfigIssue(f"nodeExporter.collectors.{name}", f"unknown node_exporter collector (known: {known})")
                )
    for section, keys in _REGEX_KEYS.items():
        sub = raw.get(section)
        if not isinstance(sub, dict):
            continue
        for key in keys:
            value = sub.get(key)
            if isinstance(value, str):
                try:
                    compile_filter(value)
                except re.error as exc:
                    where = f"nodeExporter.{section}.{key}"
                    issues.append(ConfigIssue(where, f"not a valid regular expression: {exc}"))
    return issues


def enabled_collectors(overrides: dict[str, bool]) -> list[str]:
    """The collectors to run: node_exporter's defaults with the config's overrides applied, sorted by name."""
    return sorted(name for name, on in DEFAULTS.items() if overrides.get(name, on))
