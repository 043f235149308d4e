"""The bearer token of ``server.apiTokenFile``, re-read on change (``ApiToken``). The file is read by
``nvdaemon.token.read_token``, the one reader of the server, the host checks of check-config, ``run`` and a reload
(``nvdaemon/preflight.py``) and NVSentinel's ``tokenPath``; it is re-exported here for its callers.

A browser cannot put an ``Authorization`` header on a websocket upgrade (the node page's ``/v1/events``). It offers
two subprotocols instead, ``nvdaemon.events`` and ``nvdaemon.bearer.<the token in base64url>`` (the shape Kubernetes'
API server accepts for its own bearer tokens); ``bearer_from_subprotocols`` reads the token back, and the stream
route accepts with ``chosen_subprotocol`` (a browser refuses a connection whose offered subprotocols were all
ignored). The token subprotocol is never echoed.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import time
from collections.abc import Iterable

from nvdaemon.token import MAX_TOKEN_BYTES, read_token

log = logging.getLogger(__name__)

__all__ = [
    "BEARER_SUBPROTOCOL",
    "EVENTS_SUBPROTOCOL",
    "MAX_TOKEN_BYTES",
    "TOKEN_RECHECK_SECONDS",
    "ApiToken",
    "bearer_from_subprotocols",
    "chosen_subprotocol",
    "read_token",
]

EVENTS_SUBPROTOCOL = "nvdaemon.events"
BEARER_SUBPROTOCOL = "nvdaemon.bearer."
TOKEN_RECHECK_SECONDS = 1.0  # re-read at least this often: a same-size rewrite can keep a coarse mtime


class ApiToken:
    """``server.apiTokenFile``, re-read when it changes: a ``stat`` per guarded request (device, inode, size, mtime;
    a Kubernetes secret update swaps a symlink, which changes the inode), and a read at least every
    ``TOKEN_RECHECK_SECONDS``. Rotation needs no restart: the old token stops working at once. A file that is
    missing, unreadable or empty fails closed (every guarded request 401), logged once until it is readable again."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._key: tuple[int, ...] | None = None
        self._token: bytes | None = None
        self._read_at = 0.0
        self._failing = False

    def current(self) -> bytes | None:
        """The token now in force; None: fail closed."""
        try:
            st = os.stat(self.path)
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            now = time.monotonic()
            if key != self._key or now - self._read_at >= TOKEN_RECHECK_SECONDS:
                self._token, self._key, self._read_at = read_token(self.path), key, now
        except (OSError, ValueError) as exc:
            if not self._failing:
                detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                log.error("api token file %s unusable (%s): /v1/* refused until it is readable", self.path, detail)
            self._failing, self._token, self._key = True, None, None
            return None
        if self._failing:
            log.warning("api token file %s readable again", self.path)
            self._failing = False
        return self._token


def bearer_from_subprotocols(offered: Iterable[str]) -> str | None:
    """The token a browser put in ``Sec-WebSocket-Protocol`` (``nvdaemon.bearer.<base64url>``), as the text an
    ``Authorization: Bearer`` header would carry; None when none was offered or it does not decode."""
    for proto in offered:
        if proto.startswith(BEARER_SUBPROTOCOL):
            encoded = proto[len(BEARER_SUBPROTOCOL) :].rstrip("=")
            try:
                raw = base64.b64decode(encoded + "=" * (-len(encoded) % 4), altchars=b"-_", validate=True)
                return raw.decode() or None
            except (binascii.Error, ValueError):
                return None
    return None


def chosen_subprotocol(offered: Iterable[str]) -> str | None:
    """The subprotocol to accept a ``/v1/events`` upgrade with: ``nvdaemon.events`` when offered, else none."""
    return EVENTS_SUBPROTOCOL if EVENTS_SUBPROTOCOL in offered else None
