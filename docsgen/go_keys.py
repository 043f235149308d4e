"""What each key the Go agent (nodevitals) had meant there, by our key path: the contract's §1, with the values
``goconfig`` folds into ours. A key of ours that the Go agent lacked has no entry; a path here that the schema does
not have fails ``tests/test_docs_generated.py``.
"""

from __future__ import annotations

from nvdaemon.goconfig import GO_HISTORY_DEFAULTS, GO_INTERVAL_SECONDS, GO_LISTEN, HISTORY_FILE_IN_DATA_DIR

GO_KEYS: dict[str, str] = {
    "node": "empty: the env `NODE_NAME` (Go sends an empty node when that is unset too)",
    "tier": "legacy single tier: `tier: smart` runs only smart",
    "tiers": "order kept, repeats and blanks dropped; else `[tier]`; else `[core]`; an unknown tier exits 1",
    "intervalSeconds": f"integer; `<= 0` means {GO_INTERVAL_SECONDS} (folded the same way here)",
    "procRoot": '`""` means `/proc`',
    "sysRoot": '`""` means `/sys`',
    "devRoot": '`""` means `/dev`',
    "rules[]": "state per (metric, device); here per series (metric, device, labels)",
    "rules[].device": '`""` = every device',
    "rules[].severity": "not set: an empty severity (here `warning`, with a note)",
    "rules[].threshold": "not set: 0 (folded the same way here, with a note)",
    "rules[].enterFor": "`< 1` means 1 (folded the same way here)",
    "rules[].exitFor": "`< 1` means 1 (folded the same way here)",
    "rules[].op": "absent: Go compares with `>` only",
    "sinks.webhook[]": "posted once inside the tick, dropped on failure (here spooled and retried)",
    "sinks.webhook[].url": "any `http://` URL accepted (here: accepted as `allowInsecure`, with a note)",
    "sinks.webhook[].secret": "a secret exactly `${VAR}` takes the env value; set-but-empty or unset: start-up error",
    "sinks.metrics.enabled": "parsed, unused (here: `false` is ignored with a note)",
    "sinks.metrics.listenAddr": f'`""` means `{GO_LISTEN}`; Go listen syntax (`:PORT` is every interface); '
    f"not set: `{GO_LISTEN}` (here: loopback only, with a note)",
    "nodeExporter.textfileDir": "the textfile collector's directory",
    "nodeExporter.rootfsPath": "the host root; empty: no filesystem collector",
    "nodeExporter.extraFlags": "only `--collector.X` / `--no-collector.X`, else a start-up error",
    "dcgmCompat.enabled": "same (default `false`)",
    "smartctlCompat.enabled": "same (default `false`)",
    "history.enabled": "same (default `false`)",
    "history.retentionDays": f"`<= 0` means {GO_HISTORY_DEFAULTS['retentionDays']}",
    "history.intervalMinutes": f"`<= 0` means {GO_HISTORY_DEFAULTS['intervalMinutes']}",
    "history.dataDir": f"default `/var/lib/nodevitals/history`, file `history.db` (here `{HISTORY_FILE_IN_DATA_DIR}`,"
    " the Go file left alone)",
    "history.metrics": "default: five GPU metrics",
}
