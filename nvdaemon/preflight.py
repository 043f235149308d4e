"""Checks of a valid config that only the host can answer, run before the config is used: by ``check-config``,
by ``run`` before it starts anything, and by a reload before it changes anything. A problem makes ``check-config``
and ``run`` exit 2 and a reload keep the running config; a warning is printed or logged and nothing more.

- ``sinks.metrics.listenAddr``: bound as the HTTP server binds it (``nvdaemon/server/listen.py``, SO_REUSEADDR, not
  listening) and closed at once. A host that does not resolve, an address that is not this host's, a privileged
  port and a port another process listens on are problems. A reload skips the address the running server holds.
- ``server.apiTokenFile``: read as the server reads it (``nvdaemon/server/token.py``, at most ``MAX_TOKEN_BYTES``);
  unreadable, too large or blank is a problem: the server would refuse every ``/v1/*`` request (it fails closed).
- ``sinks.nvsentinel.tokenPath`` (only when that sink is enabled): the sink re-reads it on every call, and the kubelet
  may project it after the agent starts, so a missing, unreadable or empty token is a warning; the sink reports it
  on each send (its state and metrics) and recovers once the file is there.

Messages name the key, the file or the address, never a token.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass, field

from nvdaemon.config import LoadedConfig
from nvdaemon.configcheck import ConfigIssue
from nvdaemon.server import listen
from nvdaemon.server.token import MAX_TOKEN_BYTES, read_token

__all__ = ["MAX_TOKEN_BYTES", "bind_problem", "preflight", "token_problem"]


@dataclass
class Preflight:
    problems: list[ConfigIssue] = field(default_factory=list)
    warnings: list[ConfigIssue] = field(default_factory=list)


def bind_problem(addr: str) -> str | None:
    """Why a TCP listener cannot be bound at ``addr`` (None: it can), found by binding the sockets the HTTP server
    would bind (``nvdaemon/server/listen.py``: ``:PORT`` is every interface, dual-stack where the kernel allows it)
    and closing them."""
    host, _, port = addr.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    where = f"{host or 'every interface'} port {port}"
    try:
        socks = listen.bind(addr, user_timeout_ms=1000, backlog=None)
    except ValueError:
        return "expected HOST:PORT"
    except socket.gaierror as exc:
        return f"cannot resolve host {host!r}: {exc.strerror}"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"cannot listen on {where}: already in use by another process (is an agent already running?)"
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"cannot listen on {where}: not an address of this host"
        if exc.errno == errno.EACCES:
            return f"cannot listen on {where}: port below 1024 needs privileges (CAP_NET_BIND_SERVICE)"
        return f"cannot listen on {where}: {exc.strerror or exc}"
    for sock in socks:
        sock.close()
    return None


def token_problem(path: str) -> str | None:
    """Why the token file at ``path`` cannot serve as a bearer token (None: it can)."""
    try:
        read_token(path)
    except OSError as exc:
        return f"cannot read the token file {path}: {exc.strerror or type(exc).__name__}"
    except ValueError as exc:
        return str(exc)
    return None


def preflight(loaded: LoadedConfig, *, held_addr: str | None = None) -> Preflight:
    """Every host problem of ``loaded``; ``held_addr`` is the listen address the running server holds (reload)."""
    config = loaded.config
    out = Preflight()
    addr = config.sinks.metrics.listen_addr
    if addr != held_addr and (why := bind_problem(addr)):
        out.problems.append(ConfigIssue("sinks.metrics.listenAddr", why))
    if config.server.api_token_file and (why := token_problem(config.server.api_token_file)):
        out.problems.append(ConfigIssue("server.apiTokenFile", why))
    nvsentinel = config.sinks.nvsentinel
    if nvsentinel.enabled and nvsentinel.token_path and (why := token_problem(nvsentinel.token_path)):
        out.warnings.append(ConfigIssue("sinks.nvsentinel.tokenPath", f"{why}; every send fails until it is there"))
    return out
