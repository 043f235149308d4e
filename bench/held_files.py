"""A pseudo file read through a held descriptor against one opened afresh (``nvdaemon/collectors/heldfiles.py``).

The files: those a core tick with the node_* surface reads on this machine's own /proc and /sys (the paths its
``CycleReads`` recorded), less the ones that are not procfs or sysfs. Each is read ROUNDS times both ways in this
thread, as a cycle reads them: afresh (``read_bounded``: open, fstat, read, close, and the kernel's walk of the path)
and through ``HeldFiles`` (one pread from offset 0, after the directory's one stat a cycle). Process CPU per file;
the reference is the fresh read. ``python -m bench.held_files`` runs it alone.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import trio

from bench.scrape import agent_config, collectors
from bench.table import Row
from nvdaemon.app import tier_collectors
from nvdaemon.collectors.base import ANY_FILE, SYSFS_FILE, HostRoots, read_bounded
from nvdaemon.collectors.heldfiles import HeldFiles
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.config import NodeExporterConfig
from nvdaemon.configload import parse_config
from nvdaemon.tiers import CollectorRunner, collect_tier

ROUNDS = 200


def tick_paths() -> list[str]:
    """The files one core tick with the node_* surface reads on this machine."""
    root = Path("/")
    loaded = parse_config(json.dumps(agent_config(root, collectors())), "bench.yaml", env={}, host_root=root)
    cols = tier_collectors(loaded.config, "core")

    async def one_tick() -> list[str]:
        runners = [CollectorRunner(c, trio.CapacityLimiter(4)) for c in cols]
        snap = await collect_tier("core", runners, HostRoots(), 5.0)
        assert snap.reads is not None, "a core tick records its reads"
        return list(snap.reads.paths)

    return trio.run(one_tick)


def run() -> tuple[list[Row], dict[str, Any]]:
    held = HeldFiles()
    where = NodeContext(HostRoots(), NodeExporterConfig())  # how the node_* surface reads a path: (cap, kind)
    files: list[tuple[str, str, tuple[int, int], int, int]] = []  # path, directory, its identity, cap, kind
    for path in tick_paths():
        cap, kind = where.cap_and_kind(path)
        if kind == ANY_FILE:
            continue
        directory = path.rpartition("/")[0]
        try:
            st = Path(directory).stat()
            held.read(path, (st.st_dev, st.st_ino), cap, kind)
        except OSError:
            continue  # absent here, or failing as its driver fails: read by neither way
        files.append((path, directory, (st.st_dev, st.st_ino), cap, kind))
    kept = [f for f in files if f[0] in held]
    sysfs = [f for f in kept if f[4] == SYSFS_FILE]
    fresh, through_held = per_file(held, kept)
    sysfs_fresh, sysfs_held = per_file(held, sysfs)
    held.close()
    raw = {
        "held_files": len(kept),
        "held_files_not_held": len(files) - len(kept),
        "held_read_us_per_file": through_held * 1e6,
        "fresh_read_us_per_file": fresh * 1e6,
        "held_sysfs_files": len(sysfs),
        "held_sysfs_read_us_per_file": sysfs_held * 1e6,
        "fresh_sysfs_read_us_per_file": sysfs_fresh * 1e6,
    }
    rows = [
        Row(
            f"procfs/sysfs file read, held vs opened (this host, {len(kept)} files)",
            through_held * 1e6,
            "us",
            fresh * 1e6,
        ),
        Row(
            f"sysfs attribute read, held vs opened (this host, {len(sysfs)} files)",
            sysfs_held * 1e6,
            "us",
            sysfs_fresh * 1e6,
        ),
    ]
    return rows, raw


def per_file(held: HeldFiles, files: list[tuple[str, str, tuple[int, int], int, int]]) -> tuple[float, float]:
    """Process CPU seconds per file: read afresh, and read through ``held`` (with a cycle's one stat per directory)."""
    t0 = time.process_time()
    for _ in range(ROUNDS):
        for path, _, _, cap, kind in files:
            read_bounded(path, cap, kind)
    fresh = (time.process_time() - t0) / ROUNDS / max(1, len(files))
    t0 = time.process_time()
    for _ in range(ROUNDS):
        identities: dict[str, tuple[int, int]] = {}
        for path, directory, _, cap, kind in files:
            identity = identities.get(directory)
            if identity is None:
                st = Path(directory).stat()
                identity = identities[directory] = (st.st_dev, st.st_ino)
            held.read(path, identity, cap, kind)
    return fresh, (time.process_time() - t0) / ROUNDS / max(1, len(files))


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
