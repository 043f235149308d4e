"""Reading a config file: YAML text in, a validated ``LoadedConfig`` out, every error reported at once.

Reads the config file named on the command line (at most ``config.MAX_CONFIG_BYTES``, UTF-8) or the embedded
``nvdaemon/default.yaml``, and the environment (``${VAR}``, ``NODE_NAME``, ``KUBERNETES_SERVICE_HOST``,
``XDG_STATE_HOME``). It sits above the schema (``config``) and above every validator the schema cannot express,
which import ``config`` or ``configcheck`` and never this module: the sinks' (``sinks/webhook/config.py``,
``sinks/nvsentinel/config.py``), the node_exporter surface's (``compat/node_exporter/options.py``) and the Go agent's
keys (``goconfig``). ``cli`` and ``reloading`` call it; nothing below them does.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import yaml

from nvdaemon import goconfig
from nvdaemon.compat.node_exporter.options import node_exporter_issues
from nvdaemon.config import DEFAULT_LISTEN, MAX_CONFIG_BYTES, Config, ConfigError, LoadedConfig
from nvdaemon.configcheck import (
    ENV_VAR,
    REQUIRED,
    ConfigIssue,
    InputLimitError,
    check_against,
    load_yaml,
    locate,
    path_problem,
)
from nvdaemon.kmsg.rules import rule_issues as kernel_rule_issues
from nvdaemon.sinks.nvsentinel.config import normalise_xid_keys, nvsentinel_issues
from nvdaemon.sinks.webhook.config import webhook_issues

NODE_IN_POD = (
    "not set and NODE_NAME is empty, inside Kubernetes (KUBERNETES_SERVICE_HOST is set): the hostname would be the "
    "pod's name, not the node's. Set NODE_NAME from the downward API in the container spec:\n"
    "      env:\n"
    "        - name: NODE_NAME\n"
    "          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}\n"
    "    or set node: in the config"
)


def _expand(value: Any, env: Mapping[str, str], path: str, issues: list[ConfigIssue], expanded: set[str]) -> Any:
    """Replace ``${VAR}`` in every string of the parsed tree; an unset variable is an error at its key path.

    Paths whose value came from the environment are added to ``expanded``: errors never quote those values.
    """
    if isinstance(value, str):
        if ENV_VAR.search(value):
            expanded.add(path)

        def sub(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                issues.append(ConfigIssue(path, f"environment variable {name} is not set"))
                return ""
            return env[name]

        return ENV_VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _expand(v, env, f"{path}.{k}" if path else str(k), issues, expanded) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, env, f"{path}[{i}]", issues, expanded) for i, v in enumerate(value)]
    return value


def default_state_dir(env: Mapping[str, str]) -> Path:
    """``/var/lib/nvdaemon`` as root, the XDG state directory otherwise."""
    if os.geteuid() == 0:
        return Path("/var/lib/nvdaemon")
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "nvdaemon"


def _sub(tree: dict[str, Any], key: str, kind: type[Any]) -> Any:
    """``tree[key]`` when it has the expected container type, else an empty one (its type error is reported
    elsewhere)."""
    value = tree.get(key)
    return value if isinstance(value, kind) else kind()


def _semantic_checks(raw: dict[str, Any]) -> list[ConfigIssue]:
    """Checks a type cannot express, run on the raw tree so they are reported together with type errors."""
    issues: list[ConfigIssue] = []
    sinks = _sub(raw, "sinks", dict)
    metrics = _sub(sinks, "metrics", dict)
    listen = metrics.get("listenAddr", DEFAULT_LISTEN)
    if isinstance(listen, str):
        _, sep, port = listen.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
            issues.append(
                ConfigIssue(
                    "sinks.metrics.listenAddr",
                    "expected HOST:PORT or :PORT (every interface) with a port in 0-65535 (0: any free port)",
                )
            )
    rules = _sub(raw, "rules", list)
    seen: dict[tuple[str, str, str], int] = {}
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        for field_name in ("metric", "condition"):
            text = rule.get(field_name)
            if isinstance(text, str) and not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", text):
                issues.append(ConfigIssue(f"rules[{i}].{field_name}", "expected a name of letters, digits and _"))
        key = (str(rule.get("metric")), str(rule.get("device", "")), str(rule.get("condition")))
        if key in seen:
            issues.append(
                ConfigIssue(f"rules[{i}]", f"same metric, device and condition as rules[{seen[key]}]: ambiguous")
            )
        seen.setdefault(key, i)
    hooks = _sub(sinks, "webhook", list)
    for i, hook in enumerate(hooks):
        issues += webhook_issues(hook, f"sinks.webhook[{i}]")  # https or loopback, one secret source, headers
    issues += nvsentinel_issues(raw)  # CUSTOM needs its text, check names, XID numbers
    issues += node_exporter_issues(_sub(raw, "nodeExporter", dict))  # collector names, regular expressions
    issues += kernel_rule_issues(_sub(raw, "kernelRules", list))  # patterns compile; device is a named group
    gpu = _sub(raw, "gpu", dict)
    if gpu.get("backend") == "fake" and not gpu.get("fakeScenario"):
        issues.append(ConfigIssue("gpu.fakeScenario", "required with gpu.backend fake (a fixtures/nvml/*.json file)"))
    return issues


def parse_config(
    text: str, source: str, env: Mapping[str, str] | None = None, host_root: Path | None = None
) -> LoadedConfig:
    """Parse and validate YAML text; raise ``ConfigError`` listing every problem at once."""
    env = os.environ if env is None else env
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(source, [ConfigIssue("", f"larger than {MAX_CONFIG_BYTES} bytes: not a config file")])
    try:
        raw, lines, duplicates = load_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(source, [ConfigIssue("", f"not valid YAML: {getattr(exc, 'problem', exc)}", line)]) from None
    except InputLimitError as exc:
        raise ConfigError(source, [ConfigIssue("", f"refused: {exc.message}", exc.line)]) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, [ConfigIssue("", "expected a mapping of config keys at the top level", 1)])
    issues, notes = goconfig.before_expansion(raw, env)  # a secret's ${VAR} set but empty
    expanded: set[str] = set()
    raw = _expand(raw, env, "", issues, expanded)
    normalise_xid_keys(raw)  # `xidActions: {79: RESTART_BM}`: YAML reads 79 as an int
    go_issues, go_notes = goconfig.normalise(raw, env)  # the Go agent's keys and meanings folded into ours
    issues += go_issues
    notes += go_notes
    issues += duplicates
    issues += check_against(Config, raw, redact=expanded)
    issues += _semantic_checks(raw)
    if host_root is not None and (why := path_problem(str(host_root), REQUIRED)):
        issues.append(ConfigIssue("--host-root", why))
    if not raw.get("stateDir") and (why := path_problem(str(default_state_dir(env)), REQUIRED)):
        issues.append(ConfigIssue("stateDir", f"not set, and the default from XDG_STATE_HOME {why}"))
    if issues:
        raise ConfigError(source, locate(issues, lines))
    cfg = msgspec.convert(raw, Config)
    if host_root is not None:
        cfg = msgspec.structs.replace(
            cfg,
            proc_root=str(host_root / "proc"),
            sys_root=str(host_root / "sys"),
            dev_root=str(host_root / "dev"),
            rootfs=str(host_root),
        )
    tiers = tuple(dict.fromkeys(cfg.tiers))  # goconfig resolved tier/tiers as the Go agent does
    node = cfg.node or env.get("NODE_NAME") or ""
    if not node and env.get("KUBERNETES_SERVICE_HOST"):
        # In a pod the hostname is the pod's name: every series would carry it, and NVSentinel's platform-connector
        # rejects every HealthEvent for a node that does not exist (PERMISSION_DENIED), leaving only a counter.
        raise ConfigError(source, [ConfigIssue("node", NODE_IN_POD, lines.get("node"))])
    node = node or socket.gethostname()
    state_dir = Path(cfg.state_dir) if cfg.state_dir else default_state_dir(env)
    return LoadedConfig(config=cfg, source=source, node=node, state_dir=state_dir, tiers=tiers, notes=tuple(notes))


def load_config(path: str | None, env: Mapping[str, str] | None = None, host_root: Path | None = None) -> LoadedConfig:
    """Load ``path``, or the embedded default when ``path`` is None."""
    if path is None:
        text = resources.files("nvdaemon").joinpath("default.yaml").read_text(encoding="utf-8")
        return parse_config(text, "<embedded default>", env, host_root)
    if why := path_problem(path, REQUIRED):  # open() would raise ValueError; the name is shown escaped
        raise ConfigError(ascii(path), [ConfigIssue("", f"not a usable config file name: it {why}")])
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # never more: a wrong path may name a huge file
    except OSError as exc:
        raise ConfigError(path, [ConfigIssue("", f"cannot read config file: {exc.strerror or exc}")]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(path, [ConfigIssue("", f"larger than {MAX_CONFIG_BYTES} bytes: not a config file")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        why = f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}"
        raise ConfigError(path, [ConfigIssue("", why, line)]) from None
    return parse_config(text, path, env, host_root)
