"""Webhook URL rules, pure (the config checks and the sink share them).

- the URL must be ``https://`` with a valid host, except for loopback receivers (127.0.0.0/8, ::1, ``localhost``)
  or an endpoint with ``allowInsecure: true``;
- an endpoint's name (task, metrics label, spool key) is ``webhook:<host[:port]>``: never a path, a query or
  credentials, which may carry tokens.

Messages never echo the URL: it may hold credentials.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import urllib.parse

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "transfer-encoding", "connection"})


def _valid_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    return bool(host) and len(host) <= 253 and all(_LABEL.match(lbl) for lbl in labels)


def is_loopback(host: str) -> bool:
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, allow_insecure: bool = False) -> str | None:
    """Why ``url`` cannot be a webhook endpoint, or None when it can."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError:
        return "expected an http:// or https:// URL with a valid host and port"
    if parts.scheme not in ("http", "https") or not host or not _valid_host(host):
        return "expected an http:// or https:// URL with a valid host"
    if parts.fragment:
        return "a webhook URL must not have a #fragment"
    if parts.scheme == "http" and not (is_loopback(host) or allow_insecure):
        return "expected an https:// URL (http:// is allowed for loopback receivers or with allowInsecure: true)"
    return None


def host_port(url: str) -> str:
    """``host[:port]`` of the URL, as written (the port only when the URL has one); IPv6 in brackets."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{parts.port}" if parts.port is not None else host


def endpoint_names(urls: list[str]) -> list[str]:
    """Sink names in config order: ``webhook:<host[:port]>``, and ``#<index>`` on the second and later endpoints
    of one host, so adding an endpoint never renames the ones before it."""
    seen: set[str] = set()
    names = []
    for i, url in enumerate(urls):
        base = f"webhook:{host_port(url)}"
        names.append(base if base not in seen else f"{base}#{i}")
        seen.add(base)
    return names


def url_hash(url: str) -> str:
    """Identifies a URL in the spool without storing it (it may hold credentials)."""
    return hashlib.sha256(url.encode("utf-8")).hexdigest()


def redact(text: str, url: str) -> str:
    """``text`` with the URL (and its userinfo/query, if they appear on their own) taken out."""
    parts = urllib.parse.urlsplit(url)
    for secret in (url, parts.netloc, parts.query, parts.password or ""):
        if len(secret) >= 4:
            text = text.replace(secret, "<redacted>")
    return text
