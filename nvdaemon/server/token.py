"""The bearer token of ``server.apiTokenFile``: one reader for the server (re-read on change, ``ApiToken``) and for
the host checks of check-config, ``run`` and a reload (``nvdaemon/preflight.py``). Reads at most
``MAX_TOKEN_BYTES`` of the file. NVSentinel's token has its own reader and rules
(``nvdaemon/sinks/nvsentinel_wire.py``). Messages name the file, never the token."""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

MAX_TOKEN_BYTES = 8192  # a bearer token is well under 1 KiB, and a request head is at most 16 KiB
TOKEN_RECHECK_SECONDS = 1.0  # re-read at least this often: a same-size rewrite can keep a coarse mtime


def read_token(path: str) -> bytes:
    """The token in the file at ``path``; surrounding whitespace (a trailing newline from ``echo > file``) is not
    part of it. OSError when unreadable; ValueError when empty or larger than ``MAX_TOKEN_BYTES``."""
    with open(path, "rb") as f:
        data = f.read(MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"the token file {path} is larger than {MAX_TOKEN_BYTES} bytes")
    token = data.strip()
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


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
