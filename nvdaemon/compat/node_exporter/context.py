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

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nvdaemon.collectors.base import (
    ANY_FILE,
    PROC_FILE_MAX,
    PROC_TABLE_MAX,
    PROCFS_FILE,
    SYSFS_ATTR_MAX,
    SYSFS_FILE,
    HostPath,
    HostRoots,
    NotPresent,
    read_attr,
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

    def read(self, path: HostPath) -> str:
        """A file's text through the cycle's shared read cache, within the cap of its kind; missing -> ``NoData``.

        A file under the sysfs or procfs root is opened without a stat first (``collectors.base.SYSFS_FILE``,
        ``PROCFS_FILE``): those hold no device nodes. Anything else (the root file system's files, and a process's
        directory under /proc, whose ``root``, ``cwd`` and ``fd`` lead out of procfs) is stat'ed before it is opened.
        """
        where = path if path.__class__ is str else os.fspath(path)
        sys_root, proc_root = self._prefixes
        if where.startswith(sys_root):  # 613 of the 648 files of a core tick: the shortest way
            return read_attr(where)
        if where.startswith(proc_root):
            return read_text(where, *self._proc_kind(where[len(proc_root) :]))
        return read_text(where, PROC_FILE_MAX, ANY_FILE)

    def read_limit(self, path: HostPath) -> int:
        """The size cap of a file by where it lives: sysfs attribute, growing /proc table, other file."""
        return self.cap_and_kind(path)[0]

    def cap_and_kind(self, path: HostPath) -> tuple[int, int]:
        """``(cap, kind)`` that ``read`` reads ``path`` with (``collectors.hostfiles``: ``SYSFS_FILE``,
        ``PROCFS_FILE`` or ``ANY_FILE``)."""
        # On the path's string: pathlib's is_relative_to cost as much as the read itself (hundreds per cycle).
        where = os.fspath(path)
        sys_root, proc_root = self._prefixes
        if where.startswith(sys_root):
            return SYSFS_ATTR_MAX, SYSFS_FILE
        if where.startswith(proc_root):
            return self._proc_kind(where[len(proc_root) :])
        return PROC_FILE_MAX, ANY_FILE

    @staticmethod
    def _proc_kind(rest: str) -> tuple[int, int]:
        """``(cap, kind)`` of the procfs file at ``rest`` under the procfs root."""
        top = rest.partition("/")[0]
        kind = ANY_FILE if top.isdigit() or top in _PROCESS_DIRS else PROCFS_FILE
        if top == "net" or rest.rpartition("/")[2] in _PROC_TABLES:
            return PROC_TABLE_MAX, kind
        return PROC_FILE_MAX, kind

    @functools.cached_property
    def _prefixes(self) -> tuple[str, str]:
        """The sysfs and procfs roots as string prefixes, ending in a separator."""
        return os.path.join(self.roots.sys, ""), os.path.join(self.roots.proc, "")


_PROC_TABLES = frozenset({"mounts", "mountinfo", "diskstats"})
_PROCESS_DIRS = frozenset({"self", "thread-self"})  # besides /proc/<pid>: links out of procfs live under these


class NodeCollector(Protocol):
    def collect(self, ctx: NodeContext, out: list[Family]) -> None: ...


class FunctionCollector:
    """A stateless collector: a plain function of the context."""

    def __init__(self, fn: Callable[[NodeContext, list[Family]], None]) -> None:
        self.fn = fn

    def collect(self, ctx: NodeContext, out: list[Family]) -> None:
        self.fn(ctx, out)
