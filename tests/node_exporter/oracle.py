"""The real node_exporter (Debian's prometheus-node-exporter) on a host root, and a family-by-family comparison.

``python -m tests.node_exporter.oracle HOST_ROOT [COLLECTOR ...]`` prints the differences between node_exporter and
our surface on that host (all collectors when none are named): the loop to develop a collector against.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

import msgspec
import trio

from nvdaemon.collectors.base import HostRoots
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NodeCollector
from nvdaemon.compat.node_exporter.family import render
from nvdaemon.compat.node_exporter.options import DEFAULTS
from nvdaemon.compat.node_exporter.surface import NodeExporterCollector, surface_families
from nvdaemon.config import NodeExporterConfig
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.node_exporter.exposition import ParsedFamily, parse, same_value
from tests.polling import until_sync

BINARY_NAMES = ("prometheus-node-exporter", "node_exporter")
ONCE_TIMEOUT = 30.0  # collect_once: a fixture read never takes this long; a hang fails the test, not hangs it
# Families of node_exporter's own process and build, not of a collector.
NOT_COLLECTED = ("go_", "process_", "promhttp_", "node_exporter_build_info")


def collect_once(
    roots: HostRoots, options: NodeExporterConfig, table: Mapping[str, Callable[[], NodeCollector]], names: list[str]
) -> bytes:
    """Run the named collectors through one tier cycle, as the agent does, and render them (the surface, as served)."""
    collectors = [NodeExporterCollector(name, table[name]()) for name in names if name in table]
    for c in collectors:
        c.options = options
    runners = [CollectorRunner(c, trio.CapacityLimiter(1)) for c in collectors]
    snap = trio.run(collect_tier, "core", runners, roots, ONCE_TIMEOUT)
    return render(surface_families(snap))


# Families whose values move between two reads of the same host (labels and HELP/TYPE are still compared).
TIME_DEPENDENT = frozenset(
    {
        "node_scrape_collector_duration_seconds",
        "node_time_seconds",
        "node_time_zone_offset_seconds",
        "node_filesystem_avail_bytes",
        "node_filesystem_free_bytes",
        "node_filesystem_files_free",
    }
)


def binary() -> str | None:
    for name in BINARY_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def textfile_dir(root: Path) -> Path:
    """Where a fixture host keeps its *.prom files (node_exporter's --collector.textfile.directory)."""
    return root / "var" / "lib" / "node_exporter" / "textfile_collector"


def options_for(root: Path, **overrides: object) -> NodeExporterConfig:
    """Our surface's options for a fixture host: enabled, its textfile directory, node_exporter's filters."""
    raw = {"enabled": True, "textfileDirectory": str(textfile_dir(root)), **overrides}
    return msgspec.convert(raw, NodeExporterConfig)


def flags_for(root: Path, options: NodeExporterConfig, collectors: Iterable[str]) -> list[str]:
    """node_exporter's flags for the same host root and the same filters as ``options``."""
    flags = [
        f"--path.procfs={root / 'proc'}",
        f"--path.sysfs={root / 'sys'}",
        f"--path.rootfs={root}",
        f"--path.udev.data={root / 'run' / 'udev' / 'data'}",
        "--collector.disable-defaults",
        "--no-collector.netdev.netlink",
        f"--collector.textfile.directory={options.textfile_directory}",
        f"--collector.diskstats.device-exclude={options.diskstats.device_exclude}",
        f"--collector.filesystem.mount-points-exclude={options.filesystem.mount_points_exclude}",
        f"--collector.filesystem.fs-types-exclude={options.filesystem.fs_types_exclude}",
        f"--collector.netdev.device-exclude={options.netdev.device_exclude}",
    ]
    if options.diskstats.device_include:
        flags.append(f"--collector.diskstats.device-include={options.diskstats.device_include}")
    if options.netdev.device_include:
        flags.append(f"--collector.netdev.device-include={options.netdev.device_include}")
    # hwmon chip filters arrived in node_exporter 1.7; 1.5 refuses the flags (test_sensor_group covers ours).
    flags += [f"--collector.{name}" for name in collectors]
    return flags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode())


@contextlib.contextmanager
def node_exporter(flags: list[str]) -> Iterator[str]:
    """Start node_exporter on a free loopback port; yield its /metrics URL once it answers."""
    exe = binary()
    if exe is None:
        raise RuntimeError("prometheus-node-exporter is not installed")
    port = free_port()
    proc = subprocess.Popen(
        [exe, f"--web.listen-address=127.0.0.1:{port}", "--log.level=error", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:

        def answers() -> bool:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"node_exporter exited with {proc.returncode}: {err[-2000:]}")
            try:
                scrape(url, timeout=2)
                return True
            except OSError:
                return False

        until_sync(answers, f"node_exporter on {url}", timeout=20)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def theirs(root: Path, options: NodeExporterConfig, collectors: Iterable[str]) -> str:
    with node_exporter(flags_for(root, options, collectors)) as url:
        return scrape(url)


def ours(root: Path, options: NodeExporterConfig, collectors: Iterable[str]) -> str:
    return collect_once(HostRoots.under(root), options, TABLE, list(collectors)).decode()


def collected(families: dict[str, ParsedFamily]) -> dict[str, ParsedFamily]:
    return {n: f for n, f in families.items() if not n.startswith(NOT_COLLECTED)}


def _fmt(labels: tuple[tuple[str, str], ...]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


def compare(their_text: str, our_text: str, time_dependent: frozenset[str] = TIME_DEPENDENT) -> list[str]:
    """Every difference, one readable line each: missing/extra families and series, HELP, TYPE, values."""
    want, got = collected(parse(their_text)), collected(parse(our_text))
    diffs: list[str] = []
    for name in sorted(set(want) | set(got)):
        w, g = want.get(name), got.get(name)
        if g is None:
            diffs.append(f"missing family {name} ({len(w.samples) if w else 0} series), e.g. {_example(w)}")
            continue
        if w is None:
            diffs.append(f"extra family {name} ({len(g.samples)} series), e.g. {_example(g)}")
            continue
        if w.help != g.help:
            diffs.append(f"{name}: HELP {g.help!r}, node_exporter {w.help!r}")
        if w.type != g.type:
            diffs.append(f"{name}: TYPE {g.type}, node_exporter {w.type}")
        for labels in sorted(set(w.samples) | set(g.samples)):
            if labels not in g.samples:
                diffs.append(f"{name}{_fmt(labels)}: missing (node_exporter {w.samples[labels]!r})")
            elif labels not in w.samples:
                diffs.append(f"{name}{_fmt(labels)}: extra ({g.samples[labels]!r})")
            elif name not in time_dependent and not same_value(w.samples[labels], g.samples[labels]):
                diffs.append(f"{name}{_fmt(labels)}: {g.samples[labels]!r}, node_exporter {w.samples[labels]!r}")
    return diffs


def _example(fam: ParsedFamily | None) -> str:
    if fam is None or not fam.samples:
        return "-"
    labels, value = next(iter(fam.samples.items()))
    return f"{fam.name}{_fmt(labels)} {value!r}"


def main(argv: list[str]) -> int:
    root = Path(argv[0]).resolve()
    names = argv[1:] or sorted(DEFAULTS)
    options = options_for(root)
    diffs = compare(theirs(root, options, names), ours(root, options, names))
    for line in diffs:
        print(line)
    print(f"{len(diffs)} difference(s) on {root.name} for {', '.join(names)}", file=sys.stderr)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
