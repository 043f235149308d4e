"""nvme: node_exporter's ``node_nvme_info`` (always 1) per NVMe controller in ``<sys>/class/nvme``.

Reads ``firmware_rev``, ``model``, ``serial`` and ``state`` of each ``<sys>/class/nvme/<controller>`` entry (the
kernel pads model and serial with spaces; like procfs, only the first 128 bytes of a file are read and surrounding
white space is trimmed). No /sys/class/nvme is "no data": a failed collector, as in node_exporter. A controller
with one of those files missing or unreadable fails the whole collector, with no series at all.
"""

from __future__ import annotations

from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.compat.node_exporter.sysfs import sys_read_attr

_ATTRS = ("firmware_rev", "model", "serial", "state")


def _attr(ctx: NodeContext, controller: str, attr: str) -> str:
    path = ctx.sys("class", "nvme", controller, attr)
    try:
        return sys_read_attr(ctx, path)
    except NoData as exc:
        # Absent from one controller is an error for the collector, not "no NVMe here".
        raise FileNotFoundError(f"nvme: failed to read {path}") from exc


def collect(ctx: NodeContext, out: list[Family]) -> None:
    root = ctx.sys("class", "nvme")
    try:
        controllers = sorted(entry.name for entry in root.iterdir())
    except FileNotFoundError as exc:
        raise NoData(f"{root} does not exist") from exc
    # Every controller is read before any series is sent: one bad controller leaves the family empty.
    rows = [(name, {attr: _attr(ctx, name, attr) for attr in _ATTRS}) for name in controllers]
    info = gauge("node_nvme_info", "Non-numeric data from /sys/class/nvme/<device>, value is always 1.")
    for name, attrs in rows:
        info.add(
            1.0,
            device=name,
            firmware_revision=attrs["firmware_rev"],
            model=attrs["model"],
            serial=attrs["serial"],
            state=attrs["state"],
        )
    out.append(info)
