"""The values the chart tests render: each common shape, and the secrets they must never leak."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

GO_VALUES = Path(__file__).resolve().parents[1] / "migration" / "go-values.yaml"  # the Go chart's values.yaml (0.8.6)

SECRET_A = "whsec_" + base64.b64encode(b"nvdaemon-chart-test-secret-AAAA!").decode()
SECRET_B = "whsec_" + base64.b64encode(b"nvdaemon-chart-test-secret-BBBB!").decode()
ALL_TIERS: dict[str, Any] = {"tiers": {"smart": {"enabled": True}, "gpu": {"enabled": True}}}
WEBHOOKS: dict[str, Any] = {
    "webhooks": [
        {"url": "https://backend.example/hooks/hardware", "secret": SECRET_A, "mode": "binary"},
        {"url": "https://other.example/hooks", "secret": SECRET_B, "headers": {"X-Tenant": "gpu-fleet"}},
        {"url": "https://unsigned.example/hooks"},
    ]
}
EXISTING_SECRET: dict[str, Any] = {
    "webhooks": [
        {"url": "https://backend.example/hooks/hardware", "existingSecret": {"name": "hooks", "key": "hmac"}},
    ],
    "metrics": {"apiToken": {"existingSecret": "nvdaemon-api", "key": "token"}},
}
NVSENTINEL: dict[str, Any] = {"nvsentinel": {"enabled": True, "processingStrategy": "STORE_ONLY"}}
HISTORY: dict[str, Any] = {"history": {"enabled": True, "retentionDays": 365, "metrics": ["temp_celsius", "load1"]}}
TEXTFILE_DIR = "/var/lib/node_exporter/textfile_collector"
NODE_EXPORTER: dict[str, Any] = {
    "nodeExporter": {
        "enabled": True,
        "collectors": {"infiniband": False, "nvme": False, "hwmon": True},
        "textfileDirectory": TEXTFILE_DIR,
        "netdev": {"deviceExclude": "^(veth|cali|lxc)"},
        "diskstats": {"deviceExclude": ""},  # set to "": no filter (not the agent's default)
        "filesystem": {"mountTimeoutSeconds": 3},
    }
}
MONITORING: dict[str, Any] = {
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
}

MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-tiers": ALL_TIERS,
    "single-pod": {**ALL_TIERS, "singlePod": True},
    "single-pod-core": {"singlePod": True},
    "smart-privileged": {"tiers": {"smart": {"enabled": True, "privileged": True}}},
    "gpu-only-no-hostpath": {
        "tiers": {"core": {"enabled": False}, "gpu": {"enabled": True}},
        "stateDir": {"enabled": False},
    },
    "nvsentinel": {**ALL_TIERS, **NVSENTINEL},
    "history": {**ALL_TIERS, **HISTORY},
    "webhooks": {**ALL_TIERS, **WEBHOOKS},
    "existing-secret": EXISTING_SECRET,
    "monitoring": {**ALL_TIERS, **MONITORING},
    "node-exporter": {**ALL_TIERS, **NODE_EXPORTER},
    "node-exporter-single-pod": {**NODE_EXPORTER, "singlePod": True},
    "everything": {
        **ALL_TIERS,
        **WEBHOOKS,
        **NVSENTINEL,
        **HISTORY,
        **MONITORING,
        "smartRules": [{"metric": "smart_pending_sectors", "threshold": 0, "condition": "disk_pending_sectors"}],
        "gpuRules": [
            {"metric": "gpu_temperature_celsius", "threshold": 90, "condition": "gpu_hot", "severity": "critical"}
        ],
        **NODE_EXPORTER,
        "dcgmCompat": {"enabled": True},
        "smartctlCompat": {"enabled": True},
        "extraConfig": {"spool": {"maxEvents": 5000}, "sinks": {"stream": {"maxClients": 8}}},
        "priorityClassName": "system-node-critical",
    },
}
MATRIX["single-pod-everything"] = {**MATRIX["everything"], "singlePod": True}
