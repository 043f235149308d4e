"""netclass: ``node_network_*{device}`` properties from ``<sys>/class/net/<iface>/*`` (node_exporter 1.5, sysfs).

Each entry of ``class/net`` that is not a regular file (the entries are symlinks into ``/sys/devices/...``) is a
device; each regular file in its directory is read (as procfs: one read of at most 128 bytes, trimmed). Units:
``mtu_bytes`` bytes, ``speed_bytes`` bytes per second (the file holds Mb/s), the rest are ids, flags and counts.

Attributes the kernel refuses to show fail their read with EINVAL or EOPNOTSUPP (``speed``/``duplex``/``carrier``
of a device that is not running, ``name_assign_type`` of an unnamed one, ``phys_port_*``); node_exporter skips
those files like missing ones, and so do we. A running link without carrier shows ``speed`` -1, which 1.5 still
exports (``--collector.netclass.ignore-invalid-speed`` is off): -125000 bytes/s. Numbers are parsed as Go's
``ParseInt(s, 0, 64)`` (``flags`` is ``0x1003``) and, as procfs does, an unparsable number reads as 0.
``netclass.netlink`` is off by default in 1.5 and not implemented; the ignored-devices pattern is its default.
"""

from __future__ import annotations

import errno
import os
import re

from nvdaemon.collectors.base import HostPath, NotPresent
from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType
from nvdaemon.compat.node_exporter.sysfs import sys_read_attr
from nvdaemon.goparse import parse_int, wrap_int64

IGNORED_DEVICES = re.compile("^$")  # --collector.netclass.ignored-devices default
# Read errors procfs treats as "attribute not available" rather than a failure.
_SKIPPED_ERRNOS = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.EACCES, errno.EPERM, errno.ENOENT})

# Numeric attribute file -> (metric suffix, type); ``speed`` is converted apart.
_NUMERIC: dict[str, tuple[str, FamilyType]] = {
    "addr_assign_type": ("address_assign_type", "gauge"),
    "carrier": ("carrier", "gauge"),
    "carrier_changes": ("carrier_changes_total", "counter"),
    "carrier_up_count": ("carrier_up_changes_total", "counter"),
    "carrier_down_count": ("carrier_down_changes_total", "counter"),
    "dev_id": ("device_id", "gauge"),
    "dormant": ("dormant", "gauge"),
    "flags": ("flags", "gauge"),
    "ifindex": ("iface_id", "gauge"),
    "iflink": ("iface_link", "gauge"),
    "link_mode": ("iface_link_mode", "gauge"),
    "mtu": ("mtu_bytes", "gauge"),
    "name_assign_type": ("name_assign_type", "gauge"),
    "netdev_group": ("net_dev_group", "gauge"),
    "tx_queue_len": ("transmit_queue_length", "gauge"),
    "type": ("protocol_type", "gauge"),
}
_STRINGS = ("address", "broadcast", "duplex", "operstate", "ifalias")


def read_sysfs_attr(ctx: NodeContext, path: HostPath) -> str | None:
    """An attribute's trimmed value, or None where procfs skips it (missing, no permission, EINVAL, EOPNOTSUPP)."""
    try:
        return sys_read_attr(ctx, path)
    except NotPresent:
        return None
    except OSError as exc:
        if exc.errno in _SKIPPED_ERRNOS:
            return None
        raise


def sysfs_int(value: str) -> int:
    """procfs's ``ValueParser.PInt64``: base-0 int64, and 0 (not an error) when the text does not parse."""
    try:
        return parse_int(value, base=0)
    except ValueError:
        return 0


def speed_bytes(mbits: int) -> int:
    """``int64(speed * 1000 * 1000 / 8)`` with int64 arithmetic (wraps; the division truncates toward zero)."""
    product = wrap_int64(mbits * 1_000_000)
    quotient = abs(product) // 8
    return -quotient if product < 0 else quotient


def read_device(ctx: NodeContext, name: str) -> tuple[dict[str, str], dict[str, int]]:
    """One device's string attributes and parsed numeric attributes (only those that were readable)."""
    directory = os.path.join(ctx.sys("class", "net"), name)
    strings: dict[str, str] = {}
    numbers: dict[str, int] = {}
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except FileNotFoundError as exc:
        raise NoData(directory) from exc
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue  # device/subsystem links, queues/, statistics/, power/
        # Every regular file is read, the ones not exported too: node_exporter fails the collector when one of
        # them fails with an error it does not skip. The entry's own path string: no Path built per file.
        value = read_sysfs_attr(ctx, entry.path)
        if value is None:
            continue
        if entry.name in _STRINGS:
            strings[entry.name] = value
        elif entry.name in _NUMERIC or entry.name == "speed":
            numbers[entry.name] = sysfs_int(value)
    return strings, numbers


def list_devices(ctx: NodeContext) -> list[str]:
    directory = ctx.sys("class", "net")
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError as exc:
        raise NoData(str(directory)) from exc
    # Regular files there (bonding_masters) are not devices.
    return sorted(e.name for e in entries if not e.is_file(follow_symlinks=False))


def collect(ctx: NodeContext, out: list[Family]) -> None:
    # Everything is read before anything is emitted: node_exporter fails without a sample when one device fails.
    devices = [(name, *read_device(ctx, name)) for name in list_devices(ctx) if not IGNORED_DEVICES.search(name)]
    up = Family("node_network_up", "Value is 1 if operstate is 'up', 0 otherwise.")
    info = Family("node_network_info", "Non-numeric data from /sys/class/net/<iface>, value is always 1.")
    numeric = {
        attr: Family(f"node_network_{suffix}", f"Network device property: {suffix}", kind)
        for attr, (suffix, kind) in _NUMERIC.items()
    }
    speed = Family("node_network_speed_bytes", "Network device property: speed_bytes")
    for name, strings, numbers in devices:
        up.add(1.0 if strings.get("operstate") == "up" else 0.0, device=name)
        labels = {key: strings.get(key, "") for key in _STRINGS}
        info.add(1.0, labels, device=name)
        for attr, fam in numeric.items():
            if attr in numbers:
                fam.add(numbers[attr], device=name)
        if "speed" in numbers:
            speed.add(speed_bytes(numbers["speed"]), device=name)
    out.extend([up, info, *numeric.values(), speed])
