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

Of the ~30 files of a device, only ``dev_id`` and ``dev_port`` are read once per device (``static_attrs``): the
driver sets them at probe and nothing changes them. The others that look fixed are not: setting a MAC address
makes ``addr_assign_type`` 3 (``NET_ADDR_SET``); renaming a device makes ``name_assign_type`` 4
(``NET_NAME_RENAMED``), and a rename back gives the same path and directory; enslaving the first port of a bond
copies that port's ``type``, ``addr_len`` and ``broadcast`` onto the bond; moving a device to another network
namespace and back keeps its sysfs directory but may give it a new ``ifindex``, and a veth's ``iflink`` is its
peer's ``ifindex``. ``address``, ``mtu``, ``ifalias`` and the rest are set by administrators. All of those are
read every time.
"""

from __future__ import annotations

import errno
import operator
import os
import re

from nvdaemon.collectors.base import HostPath, NotPresent, ParseError, read_attr
from nvdaemon.collectors.static_attrs import DeviceAttrs, StaticAttrs
from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.family import LABEL_SETS, SAMPLES_MAX, Family, FamilyType
from nvdaemon.compat.node_exporter.sysfs import attr_value
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
# Attributes the driver sets once (see the module docstring for the ones that only look fixed).
_FIXED = frozenset({"dev_id", "dev_port"})
DEVICES = StaticAttrs()
_BY_NAME = operator.attrgetter("name")  # a directory's entries in procfs's (ReadDir's) order


def read_sysfs_attr(path: HostPath) -> str | None:
    """An attribute's trimmed value, or None where procfs skips it (missing, no permission, EINVAL, EOPNOTSUPP).

    ``path`` is under the sysfs root: read as a sysfs attribute (``read_attr``: the cap ``NodeContext.read`` gives
    such a path, no stat before the open), two calls per file fewer than through ``sysfs.sys_read_attr``.
    """
    try:
        return attr_value(read_attr(path))
    except NotPresent:
        return None
    except OSError as exc:
        if exc.errno in _SKIPPED_ERRNOS:
            return None
        raise


def read_fixed_attr(device: DeviceAttrs, name: str) -> str | None:
    """``read_sysfs_attr`` of an attribute fixed for the life of ``device``: read once, then remembered."""
    try:
        text = device.read(name)
    except OSError as exc:
        if exc.errno in _SKIPPED_ERRNOS:
            return None  # not remembered: asked again next time, as a failing read is
        raise
    return None if text is None else attr_value(text)


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


def read_device(class_dir: str, name: str) -> tuple[dict[str, str], dict[str, int]]:
    """One device's string attributes and parsed numeric attributes (only those that were readable), from
    ``<class_dir>/<name>`` (``class_dir``: ``<sys>/class/net``)."""
    directory = os.path.join(class_dir, name)
    device = DEVICES.device(directory)  # NoData (NotPresent) for a link left by a device that is gone
    strings: dict[str, str] = {}
    numbers: dict[str, int] = {}
    try:
        entries = sorted(os.scandir(directory), key=_BY_NAME)
    except FileNotFoundError as exc:
        raise NoData(directory) from exc
    for entry in entries:
        if not entry.is_file(follow_symlinks=False):
            continue  # device/subsystem links, queues/, statistics/, power/
        # Every regular file is read, the ones not exported too: node_exporter fails the collector when one of
        # them fails with an error it does not skip. The entry's own path string: no Path built per file.
        attr = entry.name
        value = read_fixed_attr(device, attr) if attr in _FIXED else read_sysfs_attr(entry.path)
        if value is None:
            continue
        if attr in _STRINGS:
            strings[attr] = value
        elif attr in _NUMERIC or attr == "speed":
            numbers[attr] = sysfs_int(value)
    return strings, numbers


def list_devices(class_dir: str) -> list[str]:
    try:
        entries = list(os.scandir(class_dir))
    except FileNotFoundError as exc:
        raise NoData(class_dir) from exc
    # Regular files there (bonding_masters) are not devices.
    return sorted(e.name for e in entries if not e.is_file(follow_symlinks=False))


def collect(ctx: NodeContext, out: list[Family]) -> None:
    # Everything is read before anything is emitted: node_exporter fails without a sample when one device fails.
    class_dir = os.fspath(ctx.sys("class", "net"))
    devices = [
        (name, *read_device(class_dir, name)) for name in list_devices(class_dir) if not IGNORED_DEVICES.search(name)
    ]
    up = Family("node_network_up", "Value is 1 if operstate is 'up', 0 otherwise.")
    info = Family("node_network_info", "Non-numeric data from /sys/class/net/<iface>, value is always 1.")
    numeric = {
        attr: Family(f"node_network_{suffix}", f"Network device property: {suffix}", kind)
        for attr, (suffix, kind) in _NUMERIC.items()
    }
    speed = Family("node_network_speed_bytes", "Network device property: speed_bytes")
    if len(devices) > SAMPLES_MAX:  # Family.add's check, done once: the samples below are appended as they are
        raise ParseError(f"{up.name}: more than {SAMPLES_MAX} samples")
    for name, strings, numbers in devices:
        # One label tuple per device, shared by its samples (a file name is far within LABEL_MAX): Family.add
        # per sample, sorting and checking one label each time, was 5% of this collector's CPU.
        device = LABEL_SETS.canonical((("device", name),))  # the tuple an earlier cycle made (LabelSets)
        up.samples.append((device, 1.0 if strings.get("operstate") == "up" else 0.0))
        info.add(1.0, {key: strings.get(key, "") for key in _STRINGS}, device=name)
        for attr, value in numbers.items():
            if attr == "speed":
                speed.samples.append((device, float(speed_bytes(value))))
            else:
                numeric[attr].samples.append((device, float(value)))
    out.extend([up, info, *numeric.values(), speed])
