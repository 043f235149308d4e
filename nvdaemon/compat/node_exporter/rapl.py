"""rapl: ``node_rapl_<zone>_joules_total{index,path}`` from ``<sys>/class/powercap/*``.

Every entry of class/powercap with a ``name`` file is a zone: packages (``intel-rapl:0`` "package-0") and their
sub-zones (``intel-rapl:0:0`` "dram"), which sysfs also lists there as symlinks, so each zone is counted once
(the ``intel-rapl`` control-type entry has no ``name`` and is skipped). ``energy_uj`` is cumulative microjoules,
exported in joules; ``max_energy_range_uj`` must be readable too. A name ending in ``-<n>`` gives index n
("package-1" -> package, 1); other names are numbered by how often they were seen ("dram" 0, "dram" 1). ``path``
is the zone's path under the sysfs root as configured, not resolved.

Outcomes, as node_exporter 1.5's: no class/powercap, or an unreadable ``max_energy_range_uj``, fails the
collector with nothing exported; ``energy_uj`` unreadable for lack of privilege (root-only since CVE-2020-8694)
or malformed fails it after the zones before it were exported. The zone-label mode
(``--collector.rapl.enable-zone-label``: one ``node_rapl_joules_total`` family with a ``rapl_zone`` label) is
implemented for completeness but has no setting in our config; it is off, as in node_exporter.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from nvdaemon.collectors.base import NotPresent
from nvdaemon.collectors.static_attrs import StaticAttrs
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.compat.node_exporter.hwmon import Families
from nvdaemon.compat.node_exporter.sysfs import read_int_file
from nvdaemon.goparse import parse_int, trim_space

_SANITIZE = re.compile(r"_*[^0-9A-Za-z_]+_*")
# A zone's ``name`` is set when the powercap driver registers it and never changes: read once per zone directory.
# ``max_energy_range_uj`` is read every time all the same: its mode is an administrator's to change, and an
# unreadable one fails the collector. With paths built as strings: 0.165 -> 0.11 ms a tick (4 zones).
NAMES = StaticAttrs()


@dataclass(frozen=True)
class RaplZone:
    name: str  # the name file less a "-<index>" suffix
    index: int
    path: Path


def sanitize_metric_name(name: str) -> str:
    """node_exporter's SanitizeMetricName: every run of invalid characters (with its "_" around) -> "_"."""
    return _SANITIZE.sub("_", name)


def index_and_name(seen: dict[str, int], name: str) -> tuple[int, str]:
    """procfs's getIndexAndName: "package-1" -> (1, "package"); otherwise (times seen so far, name)."""
    parts = name.split("-")
    if len(parts) == 2:
        try:
            return parse_int(parts[1]), parts[0]  # strconv.Atoi: a sign is allowed
        except ValueError:
            pass
    return seen.get(name, 0), name


def list_zones(ctx: NodeContext) -> list[RaplZone]:
    base = ctx.sys("class", "powercap")
    try:
        entries = sorted(os.listdir(base), key=os.fsencode)
    except (FileNotFoundError, PermissionError) as exc:  # node_exporter: ErrNoData
        raise NotPresent(f"{base}: {exc.strerror}") from exc
    zones: list[RaplZone] = []
    seen: dict[str, int] = {}
    for entry in entries:
        directory = f"{base}/{entry}"
        try:
            raw = NAMES.device(directory).read("name")
        except (OSError, NotPresent):
            continue  # not a zone (an unreadable one, or gone)
        if raw is None:
            continue  # not a zone (the intel-rapl control type)
        index, name = index_and_name(seen, trim_space(raw))
        read_int_file(ctx, f"{directory}/max_energy_range_uj")  # not exported, but a failure fails the collector
        zones.append(RaplZone(name, index, Path(directory)))
        seen[name] = index + 1
    return zones


def collect_zones(ctx: NodeContext, out: list[Family], zone_label: bool = False) -> None:
    zones = list_zones(ctx)
    fams = Families()
    out_start = len(out)
    try:
        for z in zones:
            path = str(z.path)
            try:
                joules = read_int_file(ctx, f"{path}/energy_uj") / 1000000.0
            except PermissionError as exc:
                raise NotPresent(f"{path}/energy_uj: permission denied") from exc
            labels = {"index": str(z.index), "path": path}
            if zone_label:
                help = "Current RAPL value in joules"
                fams.add("node_rapl_joules_total", help, "counter", joules, {**labels, "rapl_zone": z.name})
            else:
                name = f"node_rapl_{sanitize_metric_name(z.name)}_joules_total"
                fams.add(name, f"Current RAPL {z.name} value in joules", "counter", joules, labels)
    finally:  # the zones before a failure were already sent by node_exporter
        out[out_start:] = fams.by_name.values()


def collect(ctx: NodeContext, out: list[Family]) -> None:
    collect_zones(ctx, out)
