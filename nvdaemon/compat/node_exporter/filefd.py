"""filefd: ``node_filefd_allocated`` and ``node_filefd_maximum`` from ``<proc>/sys/fs/file-nr`` (file handles).

The file is one line of three tab-separated counts: allocated handles, allocated-but-unused handles (always 0
since Linux 2.6, not exported) and the system-wide maximum (``fs.file-max``).
"""

from __future__ import annotations

from nvdaemon.collectors.base import ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.goparse import parse_float


def split_file_nr(text: str) -> dict[str, str]:
    """``{"allocated": token, "maximum": token}``; ParseError when there are fewer than three tab-separated fields."""
    parts = text.strip().split("\t")
    if len(parts) < 3:
        raise ParseError(f"file-nr: unexpected number of file stats in {text[:80]!r}")
    return {"allocated": parts[0], "maximum": parts[2]}


def collect(ctx: NodeContext, out: list[Family]) -> None:
    # Emitted one by one: node_exporter sends the first value before it meets a bad second one.
    for name, token in split_file_nr(ctx.read(ctx.proc("sys", "fs", "file-nr"))).items():
        try:
            value = parse_float(token)
        except ValueError as exc:
            raise ParseError(f"file-nr: invalid value {token[:40]!r}: {exc}") from None
        out.append(gauge(f"node_filefd_{name}", f"File descriptor statistics: {name}.", value))
