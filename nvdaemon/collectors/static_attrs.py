"""Sysfs attributes that are fixed for the life of a device, read once per device instead of once per tick.

A hwmon chip's ``name`` and sensor labels, a NIC's ``address``, ``type`` and ``dev_id``, a thermal zone's ``type``,
cpufreq's ``cpuinfo_min_freq``, an NVMe drive's ``model`` and ``firmware_rev``: the kernel sets them when the device
is created and never again. node_exporter re-reads them on every scrape; a third of the files a core tick read were
such attributes.

A device is its sysfs directory. ``StaticAttrs.device(directory)`` stats it (one syscall per device and tick,
shared with every collector of the tick that stats it: ``base.cycle_stat``; the attributes cost one read each) and
keeps the attributes read under it for as long as the directory is the same one: same ``(st_dev, st_ino)``. sysfs
gives a device directory that is removed and created again a new inode, so a device that goes and comes back (a
hot-plugged NIC, a driver reloaded) is read afresh in the tick that sees it; one that is gone raises
``NotPresent`` from ``device`` as its directory does. An attribute that is absent is remembered as absent
(``None``); one whose read fails otherwise is not remembered (read again next tick). At most ``MAX_DEVICES``
directories are kept, the least recently used dropped first.

Only attributes that cannot change may be read through it: a limit an administrator can write (``scaling_max_freq``,
``mtu``, a sensor's ``*_max``) must be read every tick.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from typing import Any

from nvdaemon.collectors.base import HostPath, NotPresent, cycle_stat, read_attr

MAX_DEVICES = 4096


class DeviceAttrs:
    """The fixed attributes of one device directory: ``read(name)`` is the attribute's text, None when it is absent."""

    __slots__ = ("derived", "directory", "identity", "values")

    def __init__(self, directory: str, identity: tuple[int, int]) -> None:
        self.directory = directory
        self.identity = identity
        self.values: dict[str, str | None] = {}
        # What a collector derives from this directory and keeps with it, under keys of its own (a plan of which
        # files to read, made from a listing): gone with the directory, as its attributes are.
        self.derived: dict[str, Any] = {}

    def read(self, name: str, reader: Callable[[str], str] = read_attr) -> str | None:
        """``name``'s text (``reader`` of its path, the first time), None when absent."""
        try:
            return self.values[name]
        except KeyError:
            pass
        try:
            value: str | None = reader(f"{self.directory}/{name}")
        except NotPresent:
            value = None
        self.values[name] = value  # an OSError other than absence propagates, and is not remembered
        return value


class StaticAttrs:
    """The fixed attributes of the devices one collector reads (one instance per collector kind)."""

    def __init__(self, max_devices: int = MAX_DEVICES) -> None:
        self.max_devices = max_devices
        self._lock = threading.Lock()
        self._devices: collections.OrderedDict[str, DeviceAttrs] = collections.OrderedDict()

    def device(self, directory: HostPath) -> DeviceAttrs:
        """The attributes of the device at ``directory`` (followed if a symlink, as /sys/class entries are);
        ``NotPresent`` when it is gone."""
        where = os.fspath(directory)
        try:
            st = cycle_stat(where)
        except FileNotFoundError as exc:
            raise NotPresent(where) from exc
        identity = (st.st_dev, st.st_ino)
        with self._lock:
            known = self._devices.get(where)
            if known is not None and known.identity == identity:
                self._devices.move_to_end(where)
                return known
            fresh = self._devices[where] = DeviceAttrs(where, identity)
            self._devices.move_to_end(where)
            while len(self._devices) > self.max_devices:
                self._devices.popitem(last=False)
            return fresh

    def __len__(self) -> int:
        return len(self._devices)
