"""What a node_exporter collector is given: the host roots, the surface's options, and small file helpers.

A collector is an object with ``collect(ctx, out)`` that appends ``Family`` objects to ``out``. It runs in a worker
thread (one per collector, under the core tier's read timeout), so it may block on reads. Outcomes follow
node_exporter's: returning normally is success; raising ``NoData`` (the source is absent on this node) or any other
exception is a failed scrape of that collector (``node_scrape_collector_success`` 0), and the families appended
before the exception are still served, as node_exporter sends each metric as soon as it has it.

``read`` caps each file by its kind (``collectors.base``): a sysfs attribute, a /proc table that grows with the host
(``/proc/net/*``, mounts, diskstats), or any other /proc or root file system file. A collector that carries on past
a failure node_exporter ignores (the textfile collector) lists it in ``errors``: the agent counts it as an error of
that collector without changing node_exporter's own success metric.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nvdaemon.collectors.base import (
    PROC_FILE_MAX,
    PROC_TABLE_MAX,
    SYSFS_ATTR_MAX,
    HostRoots,
    NotPresent,
    read_text,
)

if TYPE_CHECKING:
    from nvdaemon.compat.node_exporter.family import Family
    from nvdaemon.config import NodeExporterConfig

NoData = NotPresent  # node_exporter's ErrNoData: logged at debug level, still a failed collector


@dataclass(frozen=True)
class NodeContext:
    roots: HostRoots
    options: NodeExporterConfig
    errors: list[str] = field(default_factory=list, kw_only=True)  # failures the collector carried on past

    def proc(self, *parts: str) -> Path:
        return self.roots.proc.joinpath(*parts)

    def sys(self, *parts: str) -> Path:
        return self.roots.sys.joinpath(*parts)

    def rootfs(self, *parts: str) -> Path:
        """A path of the host's root file system (``/etc/os-release`` -> ``<rootfs>/etc/os-release``)."""
        return self.roots.rootfs.joinpath(*(p.lstrip("/") for p in parts))

    @property
    def udev_data(self) -> Path:
        """udev's device database (node_exporter's ``--path.udev.data``), under the host's root file system."""
        return self.rootfs("run", "udev", "data")

    def read(self, path: Path) -> str:
        """A file's text through the cycle's shared read cache, within the cap of its kind; missing -> ``NoData``."""
        return read_text(path, self.read_limit(path))

    def read_limit(self, path: Path) -> int:
        """The size cap of a file by where it lives: sysfs attribute, growing /proc table, other file."""
        if path.is_relative_to(self.roots.sys):
            return SYSFS_ATTR_MAX
        if path.is_relative_to(self.roots.proc):
            parts = path.relative_to(self.roots.proc).parts
            if parts[:1] == ("net",) or parts[-1:] in (("mounts",), ("mountinfo",), ("diskstats",)):
                return PROC_TABLE_MAX
        return PROC_FILE_MAX


class NodeCollector(Protocol):
    def collect(self, ctx: NodeContext, out: list[Family]) -> None: ...


class FunctionCollector:
    """A stateless collector: a plain function of the context."""

    def __init__(self, fn: Callable[[NodeContext, list[Family]], None]) -> None:
        self.fn = fn

    def collect(self, ctx: NodeContext, out: list[Family]) -> None:
        self.fn(ctx, out)
