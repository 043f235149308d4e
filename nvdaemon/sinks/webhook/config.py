"""Checks of one ``sinks.webhook[]`` entry that a type cannot express, on the raw (expanded) config tree.

Run by ``configload._semantic_checks`` so they are reported together with every other error. Messages name the key and
what was expected, never a value: URLs, secrets and header values may all be credentials.
"""

from __future__ import annotations

import re
from typing import Any

from nvdaemon.configcheck import ConfigIssue, path_problem
from nvdaemon.sinks.webhook import signing
from nvdaemon.sinks.webhook import url as webhook_url

MAX_SECRET_FILE_BYTES = 64 * 1024  # a few secrets of well under 1 KiB each; a larger file is a mistake, not keys


class SecretFileTooLarge(ValueError):
    """A secretFile over ``MAX_SECRET_FILE_BYTES``: refused, never read whole."""


def read_secret_file(path: str) -> list[str]:
    """The secrets in a ``secretFile``, one per non-blank line, newest first. Reads at most
    ``MAX_SECRET_FILE_BYTES`` + 1 bytes (the file may be anything the path names); raises ``SecretFileTooLarge``
    beyond that, OSError or UnicodeDecodeError for the file."""
    with open(path, "rb") as f:
        data = f.read(MAX_SECRET_FILE_BYTES + 1)
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise SecretFileTooLarge(f"the secret file is larger than {MAX_SECRET_FILE_BYTES} bytes")
    return [line.strip() for line in data.decode("utf-8").splitlines() if line.strip()]


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_OWN_PREFIXES = ("webhook-", "ce-")


def _secrets(hook: dict[str, Any], path: str, issues: list[ConfigIssue]) -> list[tuple[str, str]]:
    """Every configured secret string with the key path that names it (a secretFile line by its number); problems
    reading the secretFile are added to ``issues``."""
    secrets: list[tuple[str, Any]] = []
    if isinstance(hook.get("secret"), str) and hook["secret"]:
        secrets.append((f"{path}.secret", hook["secret"]))
    if isinstance(hook.get("secrets"), list):
        secrets += [(f"{path}.secrets[{j}]", s) for j, s in enumerate(hook["secrets"])]
    secret_file = hook.get("secretFile")
    # A path no system call takes is reported by the struct check at this key (config.FilePath); reading it would
    # raise ValueError, not OSError.
    if isinstance(secret_file, str) and secret_file and not path_problem(secret_file):
        try:
            lines = read_secret_file(secret_file)
        except SecretFileTooLarge as exc:
            issues.append(ConfigIssue(f"{path}.secretFile", str(exc)))
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or type(exc).__name__
            issues.append(ConfigIssue(f"{path}.secretFile", f"cannot read the secret file: {why}"))
        else:
            if not lines:
                issues.append(ConfigIssue(f"{path}.secretFile", "the secret file is empty"))
            secrets += [(f"{path}.secretFile (line {n + 1})", s) for n, s in enumerate(lines)]
    return [(where, s) for where, s in secrets if isinstance(s, str)]  # another type: reported by the struct check


def secret_notes(hook: Any, path: str) -> list[str]:
    """``check-config`` notes on how each ``whsec_`` secret of one entry becomes a key (reads its secretFile, if
    any; a file that cannot be read is reported by ``webhook_issues``). Names key paths, never a value."""
    if not isinstance(hook, dict):
        return []
    notes: list[str] = []
    whsec = [(where, s) for where, s in _secrets(hook, path, []) if s.startswith(signing.PREFIX)]
    if any(not signing.is_go_raw_whsec(s) for _, s in whsec):
        notes.append(
            f"{path}: a whsec_ secret is base64-decoded before signing (Standard Webhooks); the Go agent signed with "
            "the whole string as the key"
        )
    for where, secret in whsec:
        if signing.is_go_raw_whsec(secret):
            # The Go agent's key: refusing it would crash-loop a migrated agent whose receiver checks Go signatures.
            notes.append(
                f"{where}: not base64 after whsec_, so the whole string is the key, as in the Go agent; Standard "
                "Webhooks receivers will not verify it (make one with whsec_ + the base64 of 24-64 random bytes, "
                "e.g. whsec_$(openssl rand -base64 32))"
            )
    return notes


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
    for where, secret in _secrets(hook, path, issues):
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
