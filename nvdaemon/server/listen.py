"""``sinks.metrics.listenAddr`` as the bind strings hypercorn takes.

``HOST:PORT`` and ``[v6]:PORT`` are bound as written. ``:PORT`` is Go's listen syntax for every interface, and
hypercorn would read its empty host as IPv4 only, so it becomes what Go's own listener does: one IPv6 socket that
also takes IPv4 (dual-stack) where the kernel allows it, else separate ``0.0.0.0`` and ``[::]`` sockets, else
``0.0.0.0`` alone on a host without IPv6.
"""

from __future__ import annotations

import socket
from collections.abc import Callable


def ipv6_only_default() -> bool | None:
    """The kernel's IPV6_V6ONLY default for new sockets (``net.ipv6.bindv6only``), or None without IPv6."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            return bool(s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY))
    except OSError:
        return None


def bind_list(listen: str, kernel_v6only: Callable[[], bool | None] = ipv6_only_default) -> list[str]:
    """The hypercorn binds for ``listen``; ``kernel_v6only`` tells how the kernel makes IPv6 sockets."""
    host, _, port = listen.rpartition(":")
    if host:
        return [listen]
    v6only = kernel_v6only()
    if v6only is None:
        return [f"0.0.0.0:{port}"]
    if not v6only:
        return [f"[::]:{port}"]
    if port == "0":
        return [f"0.0.0.0:{port}"]  # two sockets would each get their own free port
    return [f"0.0.0.0:{port}", f"[::]:{port}"]
