"""Bearer tokens from files: one reader for ``server.apiTokenFile`` (the server, check-config, ``state``, ``tail``)
and for ``sinks.nvsentinel.tokenPath`` (each NVSentinel call). Reads at most ``MAX_TOKEN_BYTES`` of the file.

One whitespace rule for both: surrounding whitespace is not part of the token. A bearer token (RFC 6750
``b64token``: letters, digits and ``-._~+/=``; a Kubernetes service-account token is a JWT of those) never holds
whitespace, so what a file has around it can only be the newline that ``echo > file``, an editor or
``kubectl create secret --from-file`` leaves, which no header can carry: keeping it would only turn a token that
works into a refused send. Messages name the file, never the token.
"""

from __future__ import annotations

MAX_TOKEN_BYTES = 8192  # a bearer token is well under 1 KiB, and a request head is at most 16 KiB


def read_token(path: str) -> bytes:
    """The token in the file at ``path``, without surrounding whitespace. OSError when unreadable; ValueError when
    empty (or only whitespace) or larger than ``MAX_TOKEN_BYTES``."""
    with open(path, "rb") as f:
        data = f.read(MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"the token file {path} is larger than {MAX_TOKEN_BYTES} bytes")
    token = data.strip()
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token
