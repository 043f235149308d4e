"""The bearer token of ``server.apiTokenFile``, re-read on change (``ApiToken``). The file is read by
``nvdaemon.token.read_token``, the one reader of the server, the host checks of check-config, ``run`` and a reload
(``nvdaemon/preflight.py``) and NVSentinel's ``tokenPath``; it is re-exported here for its callers."""

from __future__ import annotations

import logging
import os
import time

from nvdaemon.token import MAX_TOKEN_BYTES, read_token

log = logging.getLogger(__name__)

__all__ = ["MAX_TOKEN_BYTES", "TOKEN_RECHECK_SECONDS", "ApiToken", "read_token"]

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
