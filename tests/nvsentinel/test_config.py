"""sinks.nvsentinel and the per-rule nvsentinel: block: defaults, overrides, the errors a type cannot catch, and the
node name every HealthEvent carries (no hostname fallback inside a pod)."""

from __future__ import annotations

import socket

import pytest

from nvdaemon.config import ConfigError
from nvdaemon.configload import parse_config


def test_defaults() -> None:
    s = parse_config("", "t.yaml", env={}).config.sinks.nvsentinel
    assert (s.enabled, s.socket_path, s.token_path, s.agent) == (
        False,
        "/var/run/nvsentinel.sock",
        "/var/run/secrets/nvsentinel/platform-connector/token",
        "nvdaemon",
    )
    assert (s.processing_strategy, s.healthy_baseline, s.xid_actions, s.call_timeout_seconds) == (
        "EXECUTE_REMEDIATION",
        True,
        {},
        5.0,
    )
    assert (s.max_attempts, s.retry_initial_seconds, s.retry_multiplier, s.retry_jitter) == (5, 2.0, 1.5, 0.1)


def test_overrides_and_int_xid_keys() -> None:
    text = """
sinks:
  nvsentinel: {enabled: true, processingStrategy: STORE_ONLY, xidActions: {79: NONE, "13": COMPONENT_RESET}}
rules:
  - metric: load1
    condition: load_high
    threshold: 16
    nvsentinel: {checkName: HostLoad, fatal: true, recommendedAction: CUSTOM, customRecommendedAction: page}
"""
    c = parse_config(text, "t.yaml", env={}).config
    assert c.sinks.nvsentinel.xid_actions == {"79": "NONE", "13": "COMPONENT_RESET"}
    assert c.sinks.nvsentinel.processing_strategy == "STORE_ONLY"
    block = c.rules[0].nvsentinel
    assert block is not None and (block.check_name, block.fatal, block.custom_recommended_action) == (
        "HostLoad",
        True,
        "page",
    )


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            "rules:\n  - {metric: m, condition: c, threshold: 1, nvsentinel: {recommendedAction: CUSTOM}}\n",
            "rules[0].nvsentinel.customRecommendedAction",
        ),
        (
            "rules:\n  - {metric: m, condition: c, threshold: 1, nvsentinel: {checkName: a-b}}\n",
            "rules[0].nvsentinel.checkName",
        ),
        ("rules:\n  - {metric: m, condition: c, threshold: 1, nvsentinel: {fatl: true}}\n", "rules[0].nvsentinel.fatl"),
        (
            "rules:\n  - {metric: m, condition: c, threshold: 1, nvsentinel: {recommendedAction: REBOOT}}\n",
            "rules[0].nvsentinel.recommendedAction",
        ),
        ("sinks:\n  nvsentinel: {xidActions: {abc: NONE}}\n", "sinks.nvsentinel.xidActions.abc"),
        ("sinks:\n  nvsentinel: {xidActions: {79: CUSTOM}}\n", "sinks.nvsentinel.xidActions.79"),
        ("sinks:\n  nvsentinel: {processingStrategy: UNSPECIFIED}\n", "sinks.nvsentinel.processingStrategy"),
        ("sinks:\n  nvsentinel: {retryJitter: 2}\n", "sinks.nvsentinel.retryJitter"),
    ],
)
def test_errors(text: str, path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml", env={})
    assert [i.path for i in info.value.issues] == [path]


POD = {"KUBERNETES_SERVICE_HOST": "127.0.0.1"}


@pytest.mark.parametrize(
    ("text", "env", "node"),
    [
        ("node: gpu-17\n", POD, "gpu-17"),
        ("tiers: [core]\n", {**POD, "NODE_NAME": "gpu-18"}, "gpu-18"),
        ("tiers: [core]\n", {}, socket.gethostname()),  # outside Kubernetes: the hostname
    ],
)
def test_node_identity(text: str, env: dict[str, str], node: str) -> None:
    assert parse_config(text, "c.yaml", env=env).node == node


@pytest.mark.parametrize("env", [POD, {**POD, "NODE_NAME": ""}])
def test_a_pod_without_node_name_is_a_config_error_naming_the_downward_api(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config("tiers: [core]\n", "c.yaml", env=env)
    (issue,) = err.value.issues
    assert issue.path == "node" and "spec.nodeName" in issue.message and "NODE_NAME" in issue.message
