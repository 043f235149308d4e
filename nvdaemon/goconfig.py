"""The Go agent's (nodevitals) config keys, folded into ours on the raw YAML tree before it is type-checked.

Every key the Go agent knows is accepted with its Go meaning (contract §1); where ours has its own name for the
same thing (``nodeExporter.textfileDir`` is our ``textfileDirectory``) both are accepted and, when both are set,
they must agree. ``normalise`` works on the parsed, ``${VAR}``-expanded tree and acts only on values of the right
type (a wrong type is reported by the struct check). Both passes return the problems found plus one note line per
place where the file means something the Go agent would do differently, which ``check-config`` prints and
``run`` logs. Values are never quoted in issues or notes: they may be secrets.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any, TypeGuard

from nvdaemon.compat.node_exporter.flags import node_exporter_flags
from nvdaemon.config import HISTORY_FILE_IN_DATA_DIR as HISTORY_FILE_IN_DATA_DIR  # noqa: PLC0414 (re-export)
from nvdaemon.configcheck import ENV_VAR, ConfigIssue, path_problem
from nvdaemon.sinks.webhook import config as webhook_config
from nvdaemon.sinks.webhook import url as webhook_url

GO_LISTEN = ":9847"  # the Go agent's listenAddr when it is empty
GO_INTERVAL_SECONDS = 15
GO_HISTORY_DEFAULTS = {"retentionDays": 1825, "intervalMinutes": 5}
TIERS = ("core", "smart", "gpu")
TEXTFILE_FLAG = "--collector.textfile.directory="  # the one node_exporter flag whose value is a path


_EXACT_VAR = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")
_GO_VAR = re.compile(r"\$\{[^${} ]+\}")  # what the Go agent reads as a reference (it expands e.g. ${A-B} too)
# Keys whose value is a credential, or turns one on: an empty ${VAR} there would sign with an empty key, send an
# empty token or leave /v1/* unguarded, so it stops start-up (the Go agent does so for webhook secrets).
_SECRET_KEYS = ("secret", "secrets", "secretFile", "headers")


def _section(tree: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = tree.get(key)
    return value if isinstance(value, dict) else None


def _set_str(value: Any) -> TypeGuard[str]:
    return isinstance(value, str) and value != ""


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ---- before ${VAR} expansion ----------------------------------------------------------------------------------
def _strings(value: Any, path: str) -> list[tuple[str, str]]:
    """Every (key path, string) under ``value``."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [s for i, v in enumerate(value) for s in _strings(v, f"{path}[{i}]")]
    return []


def _secret_strings(raw: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    sinks = _section(raw, "sinks") or {}
    hooks = sinks.get("webhook")
    for i, hook in enumerate(hooks if isinstance(hooks, list) else []):
        if isinstance(hook, dict):
            for key in _SECRET_KEYS:
                found += _strings(hook.get(key), f"sinks.webhook[{i}].{key}")
    found += _strings((_section(raw, "server") or {}).get("apiTokenFile"), "server.apiTokenFile")
    found += _strings((_section(sinks, "nvsentinel") or {}).get("tokenPath"), "sinks.nvsentinel.tokenPath")
    return found


def before_expansion(raw: dict[str, Any], env: Mapping[str, str]) -> tuple[list[ConfigIssue], list[str]]:
    """A credential's ``${VAR}`` that is set but empty is an error naming the variable (an unset one is reported by
    the expansion itself); ``${VAR}`` inside other text is noted, since the Go agent expands only a webhook secret
    that is exactly ``${VAR}``."""
    issues: list[ConfigIssue] = []
    for path, text in _secret_strings(raw):
        if _GO_VAR.fullmatch(text) and not _EXACT_VAR.fullmatch(text):
            issues.append(ConfigIssue(path, "${...} here must name an environment variable (letters, digits, _)"))
        for name in ENV_VAR.findall(text):
            if env.get(name) == "":
                issues.append(
                    ConfigIssue(path, f"environment variable {name} is set but empty: refusing to use an empty secret")
                )
    embedded = [path for path, text in _strings(raw, "") if ENV_VAR.search(text) and not _EXACT_VAR.fullmatch(text)]
    others = [
        path
        for path, text in _strings(raw, "")
        if _EXACT_VAR.fullmatch(text) and not re.fullmatch(r"sinks\.webhook\[\d+\]\.secret", path)
    ]
    notes = []
    if embedded or others:
        notes.append(
            f"{', '.join(embedded + others)}: ${{VAR}} is read from the environment here too (the Go agent expands "
            "only a webhook secret that is exactly ${VAR} and keeps any other text as written)"
        )
    return issues, notes


# ---- after expansion ------------------------------------------------------------------------------------------
def _tiers(raw: dict[str, Any], notes: list[str]) -> None:
    """Go: ``tiers`` when it names any tier (order kept, blanks and repeats dropped), else ``[tier]``, else core."""
    tiers, tier = raw.get("tiers"), raw.get("tier")
    if tiers is None:
        tiers = []
    if isinstance(tiers, list) and all(isinstance(t, str) for t in tiers):
        tiers = list(dict.fromkeys(t for t in tiers if t != ""))
        if tiers and tier not in (None, ""):
            notes.append("tier: ignored, tiers is set (as in the Go agent, tiers wins over the legacy tier)")
        elif not tiers:
            tiers = [tier] if tier in TIERS else ["core"]
        raw["tiers"] = tiers
    if tier == "":
        del raw["tier"]


def _intervals(raw: dict[str, Any], notes: list[str]) -> None:
    value = raw.get("intervalSeconds")
    if _is_number(value) and value <= 0:
        raw["intervalSeconds"] = GO_INTERVAL_SECONDS
        notes.append(f"intervalSeconds: {value} means {GO_INTERVAL_SECONDS} (as in the Go agent: <= 0 is the default)")
    history = _section(raw, "history")
    for key, default in GO_HISTORY_DEFAULTS.items():
        n = history.get(key) if history else None
        if history is not None and _is_number(n) and n <= 0:
            history[key] = default
            notes.append(f"history.{key}: {n} means {default} (as in the Go agent: <= 0 is the default)")


def _rules(raw: dict[str, Any], notes: list[str]) -> None:
    """A Go rule's zero values: enterFor/exitFor < 1 are 1, a missing threshold is 0; a missing severity is ours."""
    rules = raw.get("rules")
    for i, rule in enumerate(rules if isinstance(rules, list) else []):
        if not isinstance(rule, dict):
            continue
        for key in ("enterFor", "exitFor"):
            n = rule.get(key)
            if isinstance(n, int) and not isinstance(n, bool) and n < 1:
                rule[key] = 1
                notes.append(f"rules[{i}].{key}: {n} means 1 (as in the Go agent: < 1 is one sample)")
        if "threshold" not in rule:
            rule["threshold"] = 0.0
            notes.append(f"rules[{i}].threshold: not set, so 0 (as in the Go agent)")
        if "severity" not in rule:
            notes.append(f"rules[{i}].severity: not set, so warning (the Go agent sent an empty severity)")


def _roots(raw: dict[str, Any]) -> None:
    for key in ("procRoot", "sysRoot", "devRoot"):
        if raw.get(key) == "":
            del raw[key]  # Go: "" is the default /proc, /sys, /dev (ours are the same)


def _metrics_sink(raw: dict[str, Any], notes: list[str]) -> None:
    sinks = _section(raw, "sinks")
    metrics = _section(sinks, "metrics") if sinks else None
    if metrics is None or "listenAddr" not in metrics:
        notes.append(
            "sinks.metrics.listenAddr: not set, so only 127.0.0.1:9847 is listened on (the Go agent listens on "
            f'{GO_LISTEN}, every interface; write listenAddr: "{GO_LISTEN}" for that)'
        )
    elif metrics.get("listenAddr") == "":
        metrics["listenAddr"] = GO_LISTEN
    if metrics is not None and metrics.get("enabled") is False:
        notes.append(
            "sinks.metrics.enabled: false is ignored, as in the Go agent: the one listener also serves /healthz, "
            "/readyz, /v1/* and the event stream, so /metrics stays on"
        )


def _node_exporter(raw: dict[str, Any], issues: list[ConfigIssue], notes: list[str]) -> None:
    ne = _section(raw, "nodeExporter")
    if ne is None:
        return
    # A Go key's value that is no usable path stays where it was written, so that the struct check reports it at
    # that key (configcheck.path_problem) and not a second time at ours.
    go_dir, ours = ne.get("textfileDir"), ne.get("textfileDirectory")
    if _set_str(go_dir) and not path_problem(go_dir):
        if _set_str(ours) and ours != go_dir:
            issues.append(
                ConfigIssue(
                    "nodeExporter.textfileDir",
                    "textfileDir (the Go agent's name) and textfileDirectory are both set and differ: give one",
                )
            )
        else:
            ne["textfileDirectory"] = go_dir
    derived: dict[str, bool] = {}
    rootfs = ne.get("rootfsPath")
    if rootfs == "":
        derived["filesystem"] = False  # Go: no host root, no filesystem collector (not the container's mounts)
    elif _set_str(rootfs) and not path_problem(rootfs):
        if _set_str(raw.get("rootfs")) and raw["rootfs"] != rootfs:
            issues.append(ConfigIssue("nodeExporter.rootfsPath", "rootfsPath and rootfs are both set and differ"))
        else:
            raw["rootfs"] = rootfs
    elif "rootfsPath" not in ne and ne.get("enabled") is True:
        notes.append(
            "nodeExporter.rootfsPath: not set, so the filesystem collector reads the mounts under rootfs (default "
            '/); the Go agent runs no filesystem collector without it (rootfsPath: "" does that here)'
        )
    flags = ne.get("extraFlags")
    if isinstance(flags, list):
        flags = [_textfile_flag(flag, f"nodeExporter.extraFlags[{i}]", issues) for i, flag in enumerate(flags)]
        flag_issues, flag_notes, from_flags = node_exporter_flags(flags, ne)
        issues += flag_issues
        notes += flag_notes
        derived.update(from_flags)
    explicit = ne.get("collectors")
    if derived and (explicit is None or isinstance(explicit, dict)):
        ne["collectors"] = {**derived, **(explicit or {})}  # an explicit collectors entry wins over rootfsPath ""


def _textfile_flag(flag: Any, path: str, issues: list[ConfigIssue]) -> Any:
    """``flag``, or None (skipped by ``node_exporter_flags``, its index kept) when it sets the textfile directory to
    something no path can be: reported here, at the flag the operator wrote."""
    if isinstance(flag, str) and flag.startswith(TEXTFILE_FLAG) and (why := path_problem(flag[len(TEXTFILE_FLAG) :])):
        issues.append(ConfigIssue(path, f"the textfile directory {why}"))
        return None
    return flag


def _history(raw: dict[str, Any], notes: list[str]) -> None:
    history = _section(raw, "history")
    if history is None:
        return
    if _set_str(history.get("dataDir")):
        notes.append(
            f"history.dataDir: history is kept in {HISTORY_FILE_IN_DATA_DIR} in that directory; a Go agent's "
            "history.db there is left as it is and not read"
        )
    elif history.get("enabled") is True:
        notes.append(
            "history.dataDir: not set, so history is kept in stateDir/history.db (the Go agent's default is "
            "/var/lib/nodevitals/history)"
        )


def _differences(raw: dict[str, Any], env: Mapping[str, str], notes: list[str]) -> None:
    """DESIGN §9: where we differ from the Go agent on purpose, as it applies to this file."""
    if not raw.get("node") and not env.get("NODE_NAME"):
        notes.append("node: empty and NODE_NAME unset, so the hostname is used (the Go agent sends an empty node)")
    listed = raw.get("rules")
    rules = [r for r in listed if isinstance(r, dict)] if isinstance(listed, list) else []
    if rules:
        notes.append(
            "rules: state is kept per series (metric, device, labels); the Go agent kept one per (metric, device), so "
            "series that differ only in labels now enter and exit on their own"
        )
    for i, rule in enumerate(listed if isinstance(listed, list) else []):
        if isinstance(rule, dict) and rule.get("op", ">") != ">":
            notes.append(f"rules[{i}].op: the Go agent knows only > and would ignore op")
    hook_list = (_section(raw, "sinks") or {}).get("webhook")
    hooks = {i: h for i, h in enumerate(hook_list) if isinstance(h, dict)} if isinstance(hook_list, list) else {}
    if hooks:
        notes.append(
            "sinks.webhook: events are spooled in stateDir and retried until delivered (at-least-once); the Go agent "
            "posted once inside the tick and dropped what failed"
        )
    for i, hook in hooks.items():
        url = hook.get("url")
        if isinstance(url, str) and _plain_http_to_remote(url) and "allowInsecure" not in hook:
            # The Go agent posts to any http:// URL. Refusing it would stop a migrated agent from starting, so it is
            # accepted as allowInsecure, and said: signed events then cross the network unencrypted.
            hook["allowInsecure"] = True
            notes.append(
                f"sinks.webhook[{i}].url: plain http:// to a host that is not loopback, accepted as the Go agent does "
                "(events travel unencrypted; use https://, or set allowInsecure: true to acknowledge)"
            )
        notes += webhook_config.secret_notes(hook, f"sinks.webhook[{i}]")  # how each whsec_ secret becomes a key


def _plain_http_to_remote(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False  # reported by the URL check
    return parts.scheme == "http" and bool(host) and not webhook_url.is_loopback(host)


def normalise(raw: dict[str, Any], env: Mapping[str, str]) -> tuple[list[ConfigIssue], list[str]]:
    """Fold the Go keys of the expanded tree ``raw`` into ours, in place; returns (issues, notes)."""
    issues: list[ConfigIssue] = []
    notes: list[str] = []
    _tiers(raw, notes)
    _intervals(raw, notes)
    _rules(raw, notes)
    _roots(raw)
    _metrics_sink(raw, notes)
    _node_exporter(raw, issues, notes)
    _history(raw, notes)
    _differences(raw, env, notes)
    return issues, notes
