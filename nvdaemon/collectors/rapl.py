"""CPU package/core/DRAM energy from Intel RAPL, ``<sys>/class/powercap/intel-rapl:*``.

Each zone directory has ``name`` (package-0, core, uncore, dram, psys) and ``energy_uj``: cumulative energy in
microjoules, reported as joules. It wraps at ``max_energy_range_uj``; a counter reset is the consumer's business.

Real sysfs lists every zone, sub-zones included (``intel-rapl:0:0``), directly under /sys/class/powercap as a
symlink, while the zone directories themselves nest sub-zones inside their parent. Only the flat
``class/powercap`` listing is read, never recursed into, so that no zone is counted twice. ``intel-rapl-mmio:*``
zones duplicate the package zone through another interface and are ignored by the pattern.

Since the PLATYPUS side channel (CVE-2020-8694) ``energy_uj`` is root-only on most distributions, so a
``PermissionError`` is expected and steady: it is reported in ``errors`` with a stable message and in
``permission_denied``, and logged once per collector instance.

A zone whose ``name`` file is missing or unreadable still gives its energy, with ``zone=""``: the Go agent emits it
without the ``zone`` label, and Prometheus stores an empty label as no label, so the series is the same. An
unreadable (not missing) ``name`` is also listed in ``errors``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from nvdaemon.collectors.base import (
    Collector,
    Gathered,
    HostRoots,
    Interpreted,
    NotPresent,
    ParseError,
    interpreted,
    read_attr,
)
from nvdaemon.collectors.bounds import label_value
from nvdaemon.collectors.static_attrs import StaticAttrs
from nvdaemon.model import Kind, Sample, make_labels

log = logging.getLogger(__name__)

Reader = Callable[[str], str]  # a file's text, by its path (a string: cheaper to build than a Path)

_ZONE = re.compile(r"intel-rapl:[0-9]+(?::[0-9]+)?", re.ASCII)
_UINT = re.compile(r"[0-9]{1,25}", re.ASCII)
PERMISSION_MESSAGE = "energy_uj: permission denied (root-only since CVE-2020-8694)"
# A zone's ``name`` is set when the powercap driver registers it and never changes: read once per zone directory
# (with the default reader; an injected one is asked every time). 0.12 -> 0.06 ms a tick for 4 zones.
NAMES = StaticAttrs()


@dataclass(frozen=True)
class Zone:
    zone: str  # directory name, e.g. "intel-rapl:0:1"
    name: str  # contents of its ``name`` file, e.g. "dram"
    energy_uj: int


def parse_energy(text: str) -> int:
    """``energy_uj``: an unsigned decimal integer of microjoules."""
    value = text.strip()
    if not _UINT.fullmatch(value):
        raise ParseError(f"energy_uj: not an unsigned integer: {value[:40]!r}")
    return int(value)


def list_zones(roots: HostRoots) -> list[str]:
    """The zone directory names, sorted."""
    base = roots.sys / "class" / "powercap"
    try:
        zones = sorted(name for name in os.listdir(base) if _ZONE.fullmatch(name))
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NotPresent(str(base)) from exc
    if not zones:
        raise NotPresent(f"{base}: no intel-rapl zones")
    return zones


class RaplCollector(Collector):
    name = "rapl"
    tier = "core"

    def __init__(self, read: Reader = read_attr) -> None:
        self._read = read  # injectable: tests run as root, where a mode-000 file is still readable
        self.permission_denied = False  # energy_uj was unreadable for lack of privilege on the last gather
        self._denial_logged = False

    def present(self, roots: HostRoots) -> bool:
        """Whether the node has a RAPL zone: a listing of the powercap class directory, which reads no counter."""
        try:
            return any(_ZONE.fullmatch(n) for n in os.listdir(roots.sys / "class" / "powercap"))
        except (FileNotFoundError, NotADirectoryError):
            return False

    def gather(self, roots: HostRoots) -> Gathered:
        zones: list[Zone] = []
        errors: list[str] = []
        failures: list[Exception] = []
        denied = False
        base = roots.sys / "class" / "powercap"
        for zone in list_zones(roots):
            path = f"{base}/{zone}"
            try:
                label = self._zone_name(zone, path, errors)
                zones.append(Zone(zone, label, parse_energy(self._read(f"{path}/energy_uj"))))
            except PermissionError:
                denied = True
            except (OSError, NotPresent, ParseError) as exc:
                failures.append(exc)
                errors.append(f"{zone}: {exc}")
        self.permission_denied = denied
        if denied:
            # One stable entry however many zones were denied, so the caller can log it once.
            errors.insert(0, PERMISSION_MESSAGE)
            if not self._denial_logged:
                self._denial_logged = True
                log.warning("RAPL %s; energy samples unavailable until the agent can read it", PERMISSION_MESSAGE)
        elif failures and not zones:
            raise failures[0]
        return Gathered(zones, errors=errors)

    def _zone_name(self, zone: str, path: str, errors: list[str]) -> str:
        """The zone's ``name`` file, or "" when it is missing (silently) or unreadable (listed in ``errors``)."""
        try:
            if self._read is read_attr:
                text = NAMES.device(path).read("name")
                if text is None:
                    return ""
            else:
                text = self._read(f"{path}/name")
            return label_value(text.strip(), f"{zone}/name")
        except NotPresent:
            return ""
        except OSError as exc:
            errors.append(f"{zone}/name: {exc.strerror or exc}")
            return ""
        except ParseError as exc:  # a name too long for a label (it names the file)
            errors.append(str(exc))
            return ""

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        zones: list[Zone] = gathered.data
        return interpreted(
            Sample(
                metric="power_energy_joules_total",
                device=z.zone,
                value=z.energy_uj / 1_000_000,
                kind=Kind.COUNTER,
                labels=make_labels({"zone": z.name}),
                tier="core",
                timestamp=now,
            )
            for z in zones
        )
