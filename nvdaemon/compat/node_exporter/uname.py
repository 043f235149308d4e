"""uname: ``node_uname_info`` labelled by the ``uname(2)`` fields of the machine the agent runs on.

node_exporter calls the system call rather than reading files, so the host roots do not apply (in a pod that
shares the host's UTS namespace the values are the host's). Python's ``os.uname`` has no ``domainname``: the
whole ``struct utsname`` is read through libc's ``uname`` (one call, as node_exporter does); without a usable libc
the five fields come from ``os.uname`` and the domain name from this process's ``/proc/sys/kernel/domainname``,
which shows the same UTS namespace. An unset domain name reads ``(none)``, as the kernel writes it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import lru_cache
from pathlib import Path

from nvdaemon.collectors.base import SYSFS_ATTR_MAX, read_bounded
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family

HELP = "Labeled system information as provided by the uname system call."
_FIELD = 65  # __NEW_UTS_LEN + 1 on Linux
FIELDS = ("sysname", "nodename", "release", "version", "machine", "domainname")


class _Utsname(ctypes.Structure):
    _fields_ = [(name, ctypes.c_char * _FIELD) for name in FIELDS]


@lru_cache(maxsize=1)
def _libc_uname() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.uname
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.POINTER(_Utsname)]
    fn.restype = ctypes.c_int
    return fn


def _decode(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def read_uname() -> dict[str, str]:
    """The six ``struct utsname`` fields by name."""
    fn = _libc_uname()
    if fn is not None:
        buf = _Utsname()
        if fn(ctypes.byref(buf)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return {name: _decode(getattr(buf, name)) for name in FIELDS}
    u = os.uname()
    domain = read_bounded(Path("/proc/sys/kernel/domainname"), SYSFS_ATTR_MAX).decode(errors="replace").rstrip("\n")
    return {
        "sysname": u.sysname,
        "nodename": u.nodename,
        "release": u.release,
        "version": u.version,
        "machine": u.machine,
        "domainname": domain,
    }


def collect(ctx: NodeContext, out: list[Family]) -> None:
    out.append(Family("node_uname_info", HELP, "gauge").add(1.0, read_uname()))
