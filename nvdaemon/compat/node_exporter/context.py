"""What a node_exporter collector is given: the host roots, the surface's options, and small file helpers.

A collector is an object with ``collect(ctx, out)`` that appends ``Family`` objects to ``out``. It runs in a worker
thread (one per collector, under the core tier's read timeout), so it may block on reads. Outcomes follow
node_exporter's: returning normally is success; raising ``NoData`` (the source is absent on this node) or any other
exception is a failed scrape of that collector (``node_scrape_collector_success`` 0), and the families appended
before the exception are still served, as node_exporter sends each metric as soon as it has it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nvdaemon.collectors.base import HostRoots, NotPresent, read_text

if TYPE_CHECKING:
    from nvdaemon.compat.node_exporter.family import Family
    from nvdaemon.config import NodeExporterConfig

NoData = NotPresent  # node_exporter's ErrNoData: logged at debug level, still a failed collector


@dataclass(frozen=True)
class NodeContext:
    roots: HostRoots
    options: NodeExporterConfig

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
        """A file's text through the cycle's shared read cache; missing -> ``NoData``."""
        return read_text(path)


class NodeCollector(Protocol):
    def collect(self, ctx: NodeContext, out: list[Family]) -> None: ...


class FunctionCollector:
    """A stateless collector: a plain function of the context."""

    def __init__(self, fn: Callable[[NodeContext, list[Family]], None]) -> None:
        self.fn = fn

    def collect(self, ctx: NodeContext, out: list[Family]) -> None:
        self.fn(ctx, out)
