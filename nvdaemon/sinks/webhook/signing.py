"""Standard Webhooks signatures (https://www.standardwebhooks.com), pure: no I/O, no trio.

``webhook-signature`` is ``v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">``, one per key,
space-separated, so a receiver holding either the new or the old key verifies during a rotation.

Keys: a ``whsec_`` secret is base64 after the prefix and is decoded, as the specification says (the Go agent used
the text as raw bytes, which no Standard Webhooks receiver accepts). A ``whsec_`` secret that is not base64 (or is
empty after the prefix) was still a working key for the Go agent, so it is used the Go way, as the whole string's
UTF-8 bytes: refusing it would stop a migrated agent from starting. ``check-config`` notes it and the sink warns once
at start. Any other string is used as its UTF-8 bytes, for receivers written against the Go agent; such a key shorter
than ``MIN_RAW_KEY_BYTES`` draws a startup warning.

Nothing here ever formats a key into a message: errors name what is wrong, never the value.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence

PREFIX = "whsec_"
MIN_RAW_KEY_BYTES = 24


class SecretError(ValueError):
    """A secret that cannot be used; the message never contains the secret."""


def _whsec_key(secret: str) -> bytes | None:
    """The base64-decoded key of a ``whsec_`` secret; None when the rest is not base64 or decodes to nothing."""
    text = secret[len(PREFIX) :]
    try:
        # Tolerate missing padding, as the reference libraries do.
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        return None
    return key or None


def is_go_raw_whsec(secret: str) -> bool:
    """A ``whsec_`` secret that is not base64 after the prefix: signed with the whole string, as the Go agent did.
    Standard Webhooks receivers cannot verify such signatures."""
    return secret.startswith(PREFIX) and _whsec_key(secret) is None


def decode_secret(secret: str) -> bytes:
    """The HMAC key for one configured secret."""
    if not secret:
        raise SecretError("the secret is empty")
    if secret.startswith(PREFIX):
        key = _whsec_key(secret)
        if key is not None:
            return key
    return secret.encode("utf-8")  # a raw secret, or a whsec_ one that is not base64 (the Go agent's key)


def is_weak(secret: str) -> bool:
    """A raw (non-``whsec_``) secret too short to be a good HMAC key. A ``whsec_`` secret that is not base64 has its
    own warning (``is_go_raw_whsec``), so it is not counted here too."""
    return not secret.startswith(PREFIX) and len(secret.encode("utf-8")) < MIN_RAW_KEY_BYTES


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature over ``msg_id.timestamp.body`` (the exact bytes sent)."""
    signed = msg_id.encode("utf-8") + b"." + str(timestamp).encode("ascii") + b"." + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def sign_headers(keys: Sequence[bytes], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers; without keys only id and timestamp (an unsigned endpoint)."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if keys:
        headers["webhook-signature"] = " ".join(signature(k, msg_id, timestamp, body) for k in keys)
    return headers


def verify(keys: Sequence[bytes], headers: dict[str, str], body: bytes) -> bool:
    """True when one of the header's signatures matches one of ``keys`` (for ``webhook test`` and our own tests)."""
    lower = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, ts = lower["webhook-id"], int(lower["webhook-timestamp"])
        sigs = lower["webhook-signature"].split(" ")
    except (KeyError, ValueError):
        return False
    expected = [signature(k, msg_id, ts, body) for k in keys]
    return any(hmac.compare_digest(s, e) for s in sigs for e in expected)
