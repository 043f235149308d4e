"""PCIe Advanced Error Reporting counters from ``<sys>/bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal}``.

Since Linux 4.19 every AER-capable device has three files of ``<Name> <count>`` lines (drivers/pci/pcie/aer.c):
one per error type the kernel names (``RxErr``, ``BadTLP``, ... or ``Undefined``, ``DLP``, ``SDES`` (surprise
down), ``CmpltTO``, ...; unnamed bits appear as e.g. ``ERR_COR_bit[12]``) and a final ``TOTAL_ERR_COR`` /
``TOTAL_ERR_NONFATAL`` / ``TOTAL_ERR_FATAL``. All are counts since boot. Devices without the files (no AER
capability, or AER owned by firmware) are skipped; a node where no device has them has no AER to report.

Series are the Go agent's: ``pcie_aer_correctable_total``, ``pcie_aer_nonfatal_total`` and ``pcie_aer_fatal_total``,
device the PCI address, one series per line of the file with label ``error_type`` = the line's name, zeros
included (no series would be ambiguous between "no errors" and "not collected"). As in Go the ``TOTAL_ERR_*`` line
is a line like the others (``error_type="TOTAL_ERR_FATAL"``): sum without it, or select it for the device's total.

A line that is not ``<Name> <count>`` (a header or a blank-ish line a future kernel adds, a bad number) is skipped
and counted as an error of the collector, naming the file; the file's other lines are still series, as in Go, so one
odd line never costs the counters below it. Another file's ``TOTAL_`` line is skipped the same way: it is not a
count of this file's kind.
"""

from __future__ import annotations

import errno
import os
import re

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
from nvdaemon.collectors.bounds import Problems
from nvdaemon.model import Kind, Sample, make_labels

_LINE = re.compile(r"(\S+)\s+([0-9]{1,25})\s*", re.ASCII)
# One line per bit of a 32-bit AER status register, and the total: a file of more lines is not the kernel's.
LINES_MAX = 64
NAME_MAX = 64  # an error type is a label value; the kernel's longest name ("ERR_UNCOR_bit[31]"-like) is under 20

# severity -> (file name, total line name, total metric)
SEVERITIES: dict[str, tuple[str, str, str]] = {
    "correctable": ("aer_dev_correctable", "TOTAL_ERR_COR", "pcie_aer_correctable_total"),
    "nonfatal": ("aer_dev_nonfatal", "TOTAL_ERR_NONFATAL", "pcie_aer_nonfatal_total"),
    "fatal": ("aer_dev_fatal", "TOTAL_ERR_FATAL", "pcie_aer_fatal_total"),
}


def parse_aer(text: str, total_name: str) -> tuple[dict[str, int], list[str]]:
    """Parse one aer_dev_* file into ``({name: count} in file order, skipped lines)``, its ``total_name`` line
    included when present (the Go agent's test files have none). A line that is not ``<Name> <count>`` (a name over
    ``NAME_MAX`` characters included), or is another file's TOTAL_ line, is skipped and described in the second item
    (the first ``ERRORS_MAX`` word for word, then a count); lines past ``LINES_MAX`` are not read; a file with no
    usable line raises."""
    lines: dict[str, int] = {}
    skipped = Problems()
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.fullmatch(line)
        if m is None or len(m.group(1)) > NAME_MAX:
            skipped.append(f"skipped malformed line {line[:60]!r}")
        elif m.group(1).startswith("TOTAL_") and m.group(1) != total_name:
            skipped.append(f"skipped unexpected {m.group(1)[:40]} line, wanted {total_name}")
        elif len(lines) >= LINES_MAX and m.group(1) not in lines:
            skipped.append(f"more than {LINES_MAX} lines, the rest not read")
            break
        else:
            lines[m.group(1)] = int(m.group(2))
    if not lines:
        raise ParseError("no counts" + (f" ({skipped[0]})" if skipped else ""))
    return lines, skipped.summary()


# Paths are plain strings here: a node has hundreds of PCI devices, and building a Path for each of their files cost
# more CPU than asking whether the file exists.


def read_device(device: str, problems: list[tuple[str, Exception]]) -> dict[str, dict[str, int]]:
    """The AER files of one device directory that exist and have a usable line; a file that failed, and every
    line skipped in one that did not, is appended to ``problems``."""
    counts: dict[str, dict[str, int]] = {}
    for severity, (file_name, total_name, _) in SEVERITIES.items():
        path = f"{device}/{file_name}"
        try:
            counts[severity], skipped = parse_aer(read_attr(path), total_name)
        except NotPresent:
            continue
        except (OSError, ParseError) as exc:
            problems.append((path, exc))
            continue
        problems.extend((path, ParseError(why)) for why in skipped)
    return counts


_AER_FILES = tuple(file_name for file_name, _, _ in SEVERITIES.values())
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})  # what Path.exists() calls "no such file"


def _has_aer(device: str) -> bool:
    """Whether a device directory holds any aer_dev_* file. The names are looked up in the directory opened once
    (O_PATH: nothing of the device is read), which costs less than walking the whole path (a symlink into
    /sys/devices) for each."""
    try:
        fd = os.open(device, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return False
        raise
    try:
        for name in _AER_FILES:
            try:
                os.stat(name, dir_fd=fd)
                return True
            except OSError as exc:
                if exc.errno not in _ABSENT:
                    raise
        return False
    finally:
        os.close(fd)


def _describe(path: str, exc: Exception) -> str:
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return f"{path}: {detail}"


class PcieAerCollector(Collector):
    name = "pcie_aer"
    tier = "core"
    # A listing of the PCI devices and their aer_dev_* files: counters the kernel keeps in memory (the AER stats of
    # Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats), shown without touching the device.
    may_hang = False

    def gather(self, roots: HostRoots) -> Gathered:
        base = roots.sys / "bus" / "pci" / "devices"
        try:
            # Real entries are symlinks into /sys/devices/pci*; the paths below follow them.
            names = sorted(os.listdir(base))
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NotPresent(str(base)) from exc
        with_aer = [name for name in names if _has_aer(f"{base}/{name}")]
        if not with_aer:
            raise NotPresent(f"{base}: no device with AER statistics")
        problems: list[tuple[str, Exception]] = []
        data = {name: counts for name in with_aer if (counts := read_device(f"{base}/{name}", problems))}
        if problems and not data:
            raise problems[0][1]
        return Gathered(data, errors=[_describe(path, exc) for path, exc in problems])

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        data: dict[str, dict[str, dict[str, int]]] = gathered.data
        out: list[Sample] = []
        for device, by_severity in data.items():
            for severity, lines in by_severity.items():
                metric = SEVERITIES[severity][2]
                out.extend(
                    Sample(
                        metric=metric,
                        device=device,
                        value=float(count),
                        kind=Kind.COUNTER,
                        labels=make_labels({"error_type": error_type}),
                        tier="core",
                        timestamp=now,
                    )
                    for error_type, count in lines.items()
                )
        return interpreted(out)
