"""The Go agent's ``nodeExporter.extraFlags``: node_exporter command-line flags, mapped onto our config keys.

The Go agent passes them to the node_exporter it embeds and accepts only flags starting ``--collector.`` or
``--no-collector.``. Here they become ``nodeExporter.collectors`` entries and, for the per-collector filters we
implement, the matching ``nodeExporter.<collector>.<key>`` values. An unknown collector or an option flag we do not
implement is an error at its key path. Turning on a node_exporter collector we do not implement (the Go chart's own
example is ``--collector.systemd``) is accepted with a note, so a migrated config still starts; its families are
simply absent, and the note (logged at start, printed by ``check-config``) says so.
"""

from __future__ import annotations

from typing import Any

from nvdaemon.compat.node_exporter.options import DEFAULTS
from nvdaemon.configcheck import ConfigIssue

# node_exporter (1.8) collectors this agent does not implement: turning one off is what already happens.
_NOT_IMPLEMENTED = (
    "arp bcache bonding btrfs buddyinfo cgroups cpu_vulnerabilities dmi drbd drm ethtool fibrechannel interrupts "
    "ipvs ksmd lnstat logind meminfo_numa mountstats network_route nfs nfsd ntp perf processes qdisc runit selinux "
    "slabinfo softirqs supervisord sysctl systemd tapestats tcpstat timex udp_queues watchdog wifi xfs zfs zoneinfo"
)
NOT_IMPLEMENTED = frozenset(_NOT_IMPLEMENTED.split())

# node_exporter option flag -> (our nodeExporter section or "" for nodeExporter itself, our key)
OPTIONS: dict[str, tuple[str, str]] = {
    "diskstats.device-include": ("diskstats", "deviceInclude"),
    "diskstats.device-exclude": ("diskstats", "deviceExclude"),
    "filesystem.mount-points-exclude": ("filesystem", "mountPointsExclude"),
    "filesystem.fs-types-exclude": ("filesystem", "fsTypesExclude"),
    "netdev.device-include": ("netdev", "deviceInclude"),
    "netdev.device-exclude": ("netdev", "deviceExclude"),
    "hwmon.chip-include": ("hwmon", "chipInclude"),
    "hwmon.chip-exclude": ("hwmon", "chipExclude"),
    "textfile.directory": ("", "textfileDirectory"),
}


def _option(name: str, value: str, ne: dict[str, Any], path: str) -> ConfigIssue | None:
    """Set the config key of an option flag; a different value already there is an error."""
    section, key = OPTIONS[name]
    target = ne if not section else ne.setdefault(section, {})
    if not isinstance(target, dict):
        return None  # nodeExporter.<section> is not a mapping: its type error is reported by the struct check
    where = f"nodeExporter.{section + '.' if section else ''}{key}"
    if key in target and target[key] != value:
        return ConfigIssue(path, f"sets {where}, which the config or an earlier flag sets to something else")
    target[key] = value
    return None


def node_exporter_flags(flags: list[Any], ne: dict[str, Any]) -> tuple[list[ConfigIssue], list[str], dict[str, bool]]:
    """Apply ``extraFlags`` to the raw ``nodeExporter`` mapping ``ne`` (option flags set their keys in place).

    Returns (issues, notes, collectors turned on or off). Collector flags are applied in order, so a later one wins;
    an option flag that sets a key already set to another value (by the config or an earlier flag) is an error;
    ``--collector.disable-defaults`` turns off every collector no flag names.
    """
    issues: list[ConfigIssue] = []
    notes: list[str] = []
    named: dict[str, bool] = {}
    disable_defaults = False
    for i, flag in enumerate(flags):
        path = f"nodeExporter.extraFlags[{i}]"
        if not isinstance(flag, str):
            continue  # a type error, reported by the struct check
        on = flag.startswith("--collector.")
        if not on and not flag.startswith("--no-collector."):
            issues.append(ConfigIssue(path, "only --collector.* and --no-collector.* flags are accepted (as in Go)"))
            continue
        body = flag.split(".", 1)[1]
        name, eq, value = body.partition("=")
        if on and eq and name in OPTIONS:
            if (bad := _option(name, value, ne, path)) is not None:
                issues.append(bad)
        elif body == "disable-defaults":
            disable_defaults = True
        elif not on and not eq and name in NOT_IMPLEMENTED:
            notes.append(f"{path}: node_exporter's {name} collector is not implemented here, so it is off anyway")
        elif on and not eq and name in NOT_IMPLEMENTED:
            notes.append(
                f"{path}: node_exporter's {name} collector is not implemented here: its node_{name}_* families are "
                "absent (the rest of the surface is served)"
            )
        elif eq or "." in name or name not in DEFAULTS:
            issues.append(ConfigIssue(path, _unsupported(name, eq != "")))
        else:
            named[name] = on
    collectors = {name: False for name in DEFAULTS if name not in named} if disable_defaults else {}
    collectors.update(named)
    return issues, notes, collectors


def _unsupported(name: str, has_value: bool) -> str:
    if "." in name or has_value:
        known = ", ".join(f"--collector.{o}=" for o in OPTIONS)
        return f"node_exporter option flag not supported (supported: {known}; or set nodeExporter.* keys)"
    return f"unknown node_exporter collector {name!r} (known: {', '.join(sorted(DEFAULTS))})"
