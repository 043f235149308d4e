"""Checks of one ``sinks.webhook[]`` entry that a type cannot express, on the raw (expanded) config tree.

Run by ``configload._semantic_checks`` so they are reported together with every other error. Messages name the key and
what was expected, never a value: URLs, secrets and header values may all be credentials.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from nvdaemon.configcheck import ConfigIssue
from nvdaemon.sinks import signing, webhook_url

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_OWN_PREFIXES = ("webhook-", "ce-")


def webhook_issues(hook: Any, path: str) -> list[ConfigIssue]:
    if not isinstance(hook, dict):
        return []
    issues: list[ConfigIssue] = []
    url = hook.get("url")
    insecure = hook.get("allowInsecure") is True
    if isinstance(url, str):
        why = webhook_url.check_url(url, insecure)
        if why:
            issues.append(ConfigIssue(f"{path}.url", why))
    given = [k for k in ("secret", "secrets", "secretFile") if hook.get(k)]
    if len(given) > 1:
        issues.append(ConfigIssue(path, f"give only one of secret, secrets, secretFile (got {', '.join(given)})"))
    secrets: list[tuple[str, Any]] = []
    if isinstance(hook.get("secret"), str) and hook["secret"]:
        secrets.append((f"{path}.secret", hook["secret"]))
    if isinstance(hook.get("secrets"), list):
        secrets += [(f"{path}.secrets[{j}]", s) for j, s in enumerate(hook["secrets"])]
    secret_file = hook.get("secretFile")
    if isinstance(secret_file, str) and secret_file:
        try:
            lines = [ln.strip() for ln in Path(secret_file).read_text(encoding="utf-8").splitlines() if ln.strip()]
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            issues.append(ConfigIssue(f"{path}.secretFile", f"cannot read the secret file: {why}"))
        else:
            if not lines:
                issues.append(ConfigIssue(f"{path}.secretFile", "the secret file is empty"))
            secrets += [(f"{path}.secretFile (line {n + 1})", s) for n, s in enumerate(lines)]
    for where, secret in secrets:
        if not isinstance(secret, str):
            continue  # a type error, reported by the struct check
        try:
            signing.decode_secret(secret)
        except signing.SecretError as exc:
            issues.append(ConfigIssue(where, str(exc)))
    headers = hook.get("headers")
    if isinstance(headers, dict):
        for name in headers:
            key = str(name)
            if not _TOKEN.match(key):
                issues.append(ConfigIssue(f"{path}.headers", "a header name must be an HTTP token"))
            elif key.lower() in webhook_url.RESERVED_HEADERS or key.lower().startswith(_OWN_PREFIXES):
                issues.append(ConfigIssue(f"{path}.headers.{key}", "this header is set by the agent"))
    return issues
