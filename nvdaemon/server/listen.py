"""The listening sockets of ``sinks.metrics.listenAddr``, bound by the agent rather than by hypercorn, so that a
reload can bind a new address before closing the old one, and hand the same sockets (dups) from one server to the
next when only other server settings change (nothing is refused meanwhile).

``HOST:PORT`` and ``[v6]:PORT`` are bound as written. ``:PORT`` is Go's listen syntax for every interface, and
hypercorn would read its empty host as IPv4 only, so it becomes what Go's own listener does: one IPv6 socket that
also takes IPv4 (dual-stack) where the kernel allows it, else separate ``0.0.0.0`` and ``[::]`` sockets, else
``0.0.0.0`` alone on a host without IPv6.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from hypercorn.utils import repr_socket_addr

BACKLOG = 1024  # pending connections the kernel queues (capped by net.core.somaxconn)


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


def split_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or len(port) > 5 or int(port) > 65535:
        raise ValueError(f"listen address {addr!r}: expected HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(port)


def user_timeout_ms(header_timeout_seconds: float) -> int:
    return max(1, round(header_timeout_seconds)) * 1000


def set_user_timeout(sock: socket.socket, ms: int) -> None:
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, ms)


def bind(addr: str, *, user_timeout_ms: int, backlog: int | None = BACKLOG) -> list[socket.socket]:
    """Non-blocking TCP sockets bound to ``addr`` (``bind_list``), listening unless ``backlog`` is None (a reload
    reserves its new address before it applies anything, and listens only when the new server starts: until then
    a client is refused rather than left in a queue nobody reads); OSError (EADDRINUSE, EADDRNOTAVAIL, a
    name that does not resolve: socket.gaierror) when one cannot be had, with none left open. TCP_USER_TIMEOUT,
    inherited by accepted sockets: a peer that leaves sent data unacknowledged, or keeps its receive window shut,
    for ``user_timeout_ms`` is aborted by the kernel (hypercorn writes with a shielded ``send_all``; without this a
    websocket client that stops reading would hold its connection for ever)."""
    socks: list[socket.socket] = []
    try:
        for one in bind_list(addr):
            host, port = split_addr(one)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            set_user_timeout(sock, user_timeout_ms)
            sock.bind((host, port))
            if backlog is not None:
                sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def overlaps(a: str, b: str) -> bool:
    """Whether listeners on ``a`` and ``b`` would hold the same port on a common address (one of them on every
    interface): binding one while the other listens fails with EADDRINUSE even with SO_REUSEADDR."""
    (host_a, _, port_a), (host_b, _, port_b) = a.rpartition(":"), b.rpartition(":")
    wildcard = {"", "0.0.0.0", "[::]", "::"}
    return port_a == port_b != "0" and (host_a in wildcard or host_b in wildcard or host_a == host_b)


def describe(sock: socket.socket) -> str:
    return f"http://{repr_socket_addr(sock.family, sock.getsockname())}"
