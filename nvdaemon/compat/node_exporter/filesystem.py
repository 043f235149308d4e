"""filesystem: node_exporter's ``node_filesystem_*`` families, one series per mounted file system.

Mounts come from ``<proc>/1/mounts`` (the host's mount table even in a container with the host's /proc), or
``<proc>/mounts`` when PID 1's is hidden (``hidepid``); fields are device, mount point, type and options, the mount
point with the kernel's ``\\040`` (space) and ``\\011`` (tab) escapes decoded, as node_exporter decodes them.
Mount points and types matching the configured exclude patterns are skipped. Each remaining mount point is
``statfs``'ed under the host's root file system: sizes are bytes (blocks times the file system's block size),
``files``/``files_free`` are inode counts, ``readonly`` is 1 for an ``ro`` mount, and ``device_error`` is 1 (with no
other series) when statfs fails.

A statfs that blocks (an unreachable NFS server) must not hold the whole collector: a mount of a network or FUSE
file system (any type not in ``LOCAL_TYPES``) is statfs'ed in its own thread, and when it has not returned within
``mount_timeout_seconds`` the mount point is marked stuck and reported with ``device_error`` 1. The mounts of local
kernel file systems (``LOCAL_TYPES``: disks, tmpfs, overlay) answer from memory; one thread statfs's them one after
the other, as a thread per mount cost more than the statfs calls themselves. Should one of them block (a dead
disk), that mount is marked stuck in the same way, the batch thread is abandoned, and the local mounts it had not
reached get a statfs each in their own thread, with a timeout of their own: one blocked mount costs only itself (and
that cycle one more timeout at most); the next cycle's batch skips the stuck one. A stuck mount
point is not statfs'ed again (no thread pile-up on a dead server) until its blocked call returns; the state lives
in the collector object made by ``make()``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.compat.node_exporter.options import compile_filter
from nvdaemon.worker_thread import ReusableThread

_LABELS = ("device", "mountpoint", "fstype")
# Kernel file systems whose statfs answers from memory or a local block device (no network round trip, no user
# space daemon): batched in one thread. Every other type (nfs, cifs, ceph, fuse.*, autofs, ...) gets its own.
LOCAL_TYPES = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "jfs", "reiserfs", "zfs", "vfat", "msdos", "exfat", "ntfs3"}
    | {"iso9660", "udf", "squashfs", "erofs", "overlay", "tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "efivarfs"}
)


class StatResult(Protocol):
    """The fields of ``os.statvfs_result`` we use (an injected statfs returns anything shaped like it)."""

    @property
    def f_bsize(self) -> int: ...
    @property
    def f_blocks(self) -> int: ...
    @property
    def f_bfree(self) -> int: ...
    @property
    def f_bavail(self) -> int: ...
    @property
    def f_files(self) -> int: ...
    @property
    def f_ffree(self) -> int: ...


StatFS = Callable[[str], StatResult]


class MountsError(ValueError):
    """A mount table line node_exporter refuses (fewer than four fields)."""


@dataclass(frozen=True)
class Mount:
    device: str
    mount_point: str
    fs_type: str
    options: str


def parse_mounts(text: str, rootfs: str = "/") -> list[Mount]:
    """The mounts of a /proc/<pid>/mounts text; ``rootfs`` is stripped from the front of mount points."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start an empty one
    mounts: list[Mount] = []
    for line in lines:
        parts = line.removesuffix("\r").split()
        if len(parts) < 4:  # a blank line too: node_exporter refuses the whole table
            raise MountsError(f"malformed mount point information: {line[:200]!r}")
        # Only these two of the kernel's octal escapes are decoded (by node_exporter): \\134 or \\012 stay as is.
        mount_point = parts[1].replace("\\040", " ").replace("\\011", "\t")
        mounts.append(Mount(parts[0], strip_rootfs(mount_point, rootfs), parts[2], parts[3]))
    return mounts


def strip_rootfs(mount_point: str, rootfs: str) -> str:
    """node_exporter's label for a mount seen through a host root: the plain prefix (string, not path) removed."""
    if rootfs == "/":
        return mount_point
    return mount_point.removeprefix(rootfs) or "/"


def read_mounts(ctx: NodeContext) -> str:
    try:
        return ctx.read(ctx.proc("1", "mounts"))
    except NoData:
        # PID 1's table is hidden (hidepid); the collector's own view. Missing too: the collector fails.
        return ctx.read(ctx.proc("mounts"))


def _excluded(pattern: re.Pattern[str] | None, value: str) -> bool:
    # node_exporter compiles an empty pattern too, and the empty regexp matches everything: all excluded.
    return pattern is None or pattern.search(value) is not None


class _Call:
    """One statfs, in a thread of its mount point's own so that the collector can stop waiting for it."""

    def __init__(self, owner: FilesystemCollector, mount_point: str, path: str, thread: ReusableThread) -> None:
        self.owner = owner
        self.mount_point = mount_point
        self.done = threading.Event()
        self.result: StatResult | None = None
        thread.run_soon(lambda: self._run(path))

    def _run(self, path: str) -> None:
        try:
            self.result = self.owner.statfs(path)
        except Exception:  # OSError, or ValueError for a NUL in the path: device_error 1
            pass  # node_exporter logs it at debug level only
        finally:
            with self.owner.lock:
                self.done.set()
                self.owner.stuck.discard(self.mount_point)  # it answered: monitored again from the next cycle

    def wait(self, deadline: float) -> StatResult | None:
        """The result, or ``None`` (failed, or not back by ``deadline``: the mount point is then stuck)."""
        if not self.done.wait(max(0.0, deadline - time.monotonic())):
            with self.owner.lock:
                if not self.done.is_set():  # it may have returned between the timeout and the lock
                    self.owner.stuck.add(self.mount_point)
        return self.result


class _Batch:
    """The statfs of several local mounts, one after the other in one thread; ``results[i]`` is the i-th's."""

    def __init__(self, owner: FilesystemCollector, items: list[tuple[str, str]]) -> None:
        self.owner = owner
        self.done = threading.Event()
        self.results: list[StatResult | None] = [None] * len(items)
        self.current: str | None = None  # the mount point whose statfs is under way
        self.abandoned = False  # the collector stopped waiting: a late return must not go on with the rest
        owner.batch_thread.run_soon(lambda: self._run(items))

    def _run(self, items: list[tuple[str, str]]) -> None:
        owner = self.owner
        try:
            for index, (mount_point, path) in enumerate(items):
                with owner.lock:
                    if self.abandoned:
                        return
                    self.current = mount_point
                try:
                    result: StatResult | None = owner.statfs(path)
                except Exception:  # as _Call: device_error 1
                    result = None
                with owner.lock:
                    self.results[index] = result
                    self.current = None
                    owner.stuck.discard(mount_point)  # when this one was stuck: monitored again from the next cycle
        finally:
            with owner.lock:
                self.done.set()

    def wait(self, deadline: float) -> list[StatResult | None]:
        """The results so far; when the batch is not done by ``deadline``, the mount under way is marked stuck and
        the rest of the batch is given up (``None``: device_error 1 this cycle)."""
        if not self.done.wait(max(0.0, deadline - time.monotonic())):
            with self.owner.lock:
                if not self.done.is_set():
                    self.abandoned = True
                    if self.current is not None:
                        self.owner.stuck.add(self.current)
        with self.owner.lock:
            return list(self.results)


class FilesystemCollector:
    """The collector, with the set of mount points whose statfs is blocked (shared by every cycle)."""

    def __init__(self, statfs: StatFS | None = None) -> None:
        self.statfs: StatFS = statfs or os.statvfs
        self.lock = threading.Lock()
        self.stuck: set[str] = set()
        # Kept from cycle to cycle (a new thread per statfs batch cost more than the batch, nvdaemon.worker_thread):
        # one for the local batch, one per other mount point, forgotten once the mount point is gone.
        self.batch_thread = ReusableThread("statfs local mounts")
        self.mount_threads: dict[str, ReusableThread] = {}

    def start(self, mount_point: str, path: str) -> _Call | None:
        """A statfs of ``path`` under way, or ``None`` while an earlier one of this mount point is still blocked."""
        with self.lock:
            if mount_point in self.stuck:
                return None
        thread = self.mount_threads.get(mount_point)
        if thread is None:
            thread = self.mount_threads[mount_point] = ReusableThread(f"statfs {mount_point}")
        return _Call(self, mount_point, path, thread)

    def collect(self, ctx: NodeContext, out: list[Family]) -> None:
        opts = ctx.options.filesystem
        rootfs = str(ctx.roots.rootfs)
        mounts = parse_mounts(read_mounts(ctx), rootfs)
        points_exclude = compile_filter(opts.mount_points_exclude)
        types_exclude = compile_filter(opts.fs_types_exclude)

        error = gauge(
            "node_filesystem_device_error", "Whether an error occurred while getting statistics for the given device."
        )
        size = gauge("node_filesystem_size_bytes", "Filesystem size in bytes.")
        free = gauge("node_filesystem_free_bytes", "Filesystem free space in bytes.")
        avail = gauge("node_filesystem_avail_bytes", "Filesystem space available to non-root users in bytes.")
        files = gauge("node_filesystem_files", "Filesystem total file nodes.")
        files_free = gauge("node_filesystem_files_free", "Filesystem total free file nodes.")
        readonly = gauge("node_filesystem_readonly", "Filesystem read-only status.")
        out += [error, size, free, avail, files, files_free, readonly]

        # Mounts listed twice (a repeated bind) give one series. The local batch and every other mount's statfs
        # start at once and share one deadline, so several mounts of one dead NFS server cost one timeout per
        # cycle, not one each.
        selected = [
            m
            for m in dict.fromkeys(mounts)
            if not (_excluded(points_exclude, m.mount_point) or _excluded(types_exclude, m.fs_type))
        ]
        paths = [os.path.normpath(os.path.join(rootfs, m.mount_point.lstrip("/"))) for m in selected]
        points = {m.mount_point for m in selected}
        self.mount_threads = {p: t for p, t in self.mount_threads.items() if p in points}
        with self.lock:
            stuck = set(self.stuck)
        local = [i for i, m in enumerate(selected) if m.fs_type in LOCAL_TYPES and m.mount_point not in stuck]
        batched = set(local)
        batch = _Batch(self, [(selected[i].mount_point, paths[i]) for i in local]) if local else None
        calls = [
            None if i in batched else self.start(m.mount_point, path)
            for i, (m, path) in enumerate(zip(selected, paths, strict=True))
        ]
        deadline = time.monotonic() + opts.mount_timeout_seconds
        results = dict(zip(local, batch.wait(deadline), strict=True)) if batch is not None else {}
        if batch is not None and batch.abandoned:
            # The batch stopped at a blocked mount: those it had not reached (or that failed) get their own call.
            retry = {i: self.start(selected[i].mount_point, paths[i]) for i in local if results[i] is None}
            late = time.monotonic() + opts.mount_timeout_seconds
            results.update((i, call.wait(late)) for i, call in retry.items() if call is not None)
        results.update((i, call.wait(deadline)) for i, call in enumerate(calls) if call is not None)
        for i, mount in enumerate(selected):
            labels = dict(zip(_LABELS, (mount.device, mount.mount_point, mount.fs_type), strict=True))
            st = results.get(i)  # None: failed, timed out, or stuck since an earlier cycle
            error.add(0.0 if st is not None else 1.0, labels)
            if st is None:
                continue
            bsize = float(st.f_bsize)
            size.add(float(st.f_blocks) * bsize, labels)
            free.add(float(st.f_bfree) * bsize, labels)
            avail.add(float(st.f_bavail) * bsize, labels)
            files.add(float(st.f_files), labels)
            files_free.add(float(st.f_ffree), labels)
            readonly.add(1.0 if "ro" in mount.options.split(",") else 0.0, labels)


def make(statfs: StatFS | None = None) -> FilesystemCollector:
    return FilesystemCollector(statfs)
