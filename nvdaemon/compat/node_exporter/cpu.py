"""cpu: per-CPU time, isolation and thermal throttling, as node_exporter 1.5's ``cpu`` collector serves them.

Reads ``<proc>/stat`` (USER_HZ ticks, served as seconds: ``node_cpu_seconds_total{cpu,mode}`` and
``node_cpu_guest_seconds_total{cpu,mode}``), ``<sys>/devices/system/cpu/isolated`` (a CPU list:
``node_cpu_isolated{cpu}``) and ``<sys>/devices/system/cpu/cpuN/{topology,thermal_throttle}/*`` (event counts:
``node_cpu_core_throttles_total{package,core}``, ``node_cpu_package_throttles_total{package}``).
``node_cpu_info`` and the flag/bug families need ``--collector.cpu.info``, off by default, and are not served.

The times are not served raw: like node_exporter we keep the highest value seen per CPU and mode, so a counter
that steps back a little (the kernel's idle/iowait accounting does on NOHZ CPUs) never decreases on /metrics.
An idle time that falls by 3 s or more means a hotplugged CPU: its values start over.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

from nvdaemon.collectors.base import NotPresent, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import LABEL_SETS, SAMPLES_MAX, Family
from nvdaemon.compat.node_exporter.procstat import CPU_FIELDS, read_stat
from nvdaemon.compat.node_exporter.sysfs import read_int_file
from nvdaemon.goparse import glob, parse_int

JUMP_BACK_SECONDS = 3.0  # an idle step back this large is a CPU that went away and came back
IDLE = CPU_FIELDS.index("idle")
_MODES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# Each mode's label pair and its index in a /proc/stat cpu line, for node_cpu_seconds_total; then the guest modes'.
_MODE_FIELDS = tuple((("mode", mode), CPU_FIELDS.index(mode)) for mode in _MODES)
_GUEST_FIELDS = ((("mode", "user"), CPU_FIELDS.index("guest")), (("mode", "nice"), CPU_FIELDS.index("guest_nice")))
_UINT16 = 1 << 16
_CPU_DIR = re.compile(r"cpu[0-9].*", re.DOTALL)


def parse_isolated(text: str) -> list[int]:
    """``isolated`` ("2,4-7\\n", possibly empty) as procfs reads it: CPU numbers truncated to 16 bits."""
    cpus: list[int] = []
    for item in text.rstrip("\n").split(","):
        if not item:
            continue
        if len(cpus) >= _UINT16:  # every 16-bit CPU number listed already: more is a list no kernel writes
            raise ValueError(f"more than {_UINT16} CPUs listed")
        if "-" in item:
            bounds = item.split("-")
            if len(bounds) != 2:
                raise ValueError(f"invalid cpu range: {item[:40]!r}")
            start, end = parse_int(bounds[0]), parse_int(bounds[1])
            if end - start + 1 >= _UINT16:  # every 16-bit value, without walking a huge range
                cpus.extend(range(_UINT16))
            else:
                cpus.extend(i % _UINT16 for i in range(start, end + 1))
            continue
        cpus.append(parse_int(item) % _UINT16)
    return cpus


def cpu_dirs(ctx: NodeContext) -> list[Path]:
    """``<sys>/devices/system/cpu/cpu[0-9]*`` in Go's filepath.Glob order (byte order: cpu10 before cpu2)."""
    return glob(ctx.sys("devices", "system", "cpu"), _CPU_DIR)


def _read_uint(ctx: NodeContext, path: str) -> int | None:
    """node_exporter's readUintFromFile; any failure (absent, unreadable, not a number) is None here."""
    try:
        return read_int_file(ctx, path)
    except (NotPresent, OSError, ValueError):
        return None


class CpuCollector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: list[list[float]] = []  # highest values seen, per CPU index, in CPU_FIELDS order
        self._isolated: list[int] | None = None
        self._isolated_read = False  # node_exporter reads the isolated list once, when it starts

    def collect(self, ctx: NodeContext, out: list[Family]) -> None:
        if not self._isolated_read:
            self._isolated = self._read_isolated(ctx)
            self._isolated_read = True
        stats = self._update(read_stat(ctx).cpus)
        seconds = Family("node_cpu_seconds_total", "Seconds the CPUs spent in each mode.", "counter")
        guest_help = "Seconds the CPUs spent in guests (VMs) for each mode."
        guest = Family("node_cpu_guest_seconds_total", guest_help, "counter")
        if len(stats) * len(_MODES) > SAMPLES_MAX:  # Family.add's check, once: the samples are appended as they are
            raise ParseError(f"{seconds.name}: more than {SAMPLES_MAX} samples")
        # Label pairs built sorted by name (cpu, mode) and values already floats: Family.add per sample (a dict, a
        # sort and a length check each) was a third of this collector's CPU, 8 samples a CPU on a 128-CPU node.
        # The label tuples an earlier cycle made (LabelSets): 8 a CPU, none left new for the garbage collector.
        canonical = LABEL_SETS.canonical
        for index, values in enumerate(stats):
            cpu = ("cpu", str(index))
            seconds.samples.extend([(canonical((cpu, mode)), values[i]) for mode, i in _MODE_FIELDS])
            # guest time is also inside user/nice; node_exporter serves it apart
            guest.samples.extend([(canonical((cpu, mode)), values[i]) for mode, i in _GUEST_FIELDS])
        out += [seconds, guest]
        if self._isolated is not None:
            help_ = "Whether each core is isolated, information from /sys/devices/system/cpu/isolated."
            isolated = Family("node_cpu_isolated", help_, "gauge")
            for number in self._isolated:
                isolated.add(1.0, cpu=str(number))
            out.append(isolated)
        out += self._throttles(ctx)

    @staticmethod
    def _read_isolated(ctx: NodeContext) -> list[int] | None:
        try:
            text = ctx.read(ctx.sys("devices", "system", "cpu", "isolated"))
        except NotPresent:
            return None  # no such file: no family (an empty file is an empty family)
        return parse_isolated(text)  # a bad list stops node_exporter at start; here it fails the collector

    def _update(self, new: list[tuple[float, ...]]) -> list[list[float]]:
        with self._lock:
            if len(self._stats) != len(new):  # CPUs came or went: start over
                self._stats = [[0.0] * len(CPU_FIELDS) for _ in new]
            for have, now in zip(self._stats, new, strict=True):
                if have[IDLE] - now[IDLE] >= JUMP_BACK_SECONDS:
                    have[:] = [0.0] * len(CPU_FIELDS)
                for i, value in enumerate(now):
                    # a smaller (or NaN) value keeps the one already served; not max(): NaN and -0.0 differ
                    if value >= have[i]:  # noqa: PLR1730
                        have[i] = value
            return [list(v) for v in self._stats]

    @staticmethod
    def _throttles(ctx: NodeContext) -> list[Family]:
        """Thermal throttle counts: read from the first CPU (in glob order) of each core and package."""
        packages: dict[int, int] = {}
        cores: dict[int, dict[int, int]] = {}
        # Paths as strings (the read cache's key): a Path joined per file was a sixth of this collector's CPU.
        for cpu in map(str, cpu_dirs(ctx)):
            package = _read_uint(ctx, f"{cpu}/topology/physical_package_id")
            core = _read_uint(ctx, f"{cpu}/topology/core_id")
            if package is None or core is None:
                continue
            package_cores = cores.setdefault(package, {})
            if core not in package_cores:  # a sibling that cannot be read leaves the core to the next one
                count = _read_uint(ctx, f"{cpu}/thermal_throttle/core_throttle_count")
                if count is not None:
                    package_cores[core] = count
            if package not in packages:
                count = _read_uint(ctx, f"{cpu}/thermal_throttle/package_throttle_count")
                if count is not None:
                    packages[package] = count
        package_help = "Number of times this CPU package has been throttled."
        package_fam = Family("node_cpu_package_throttles_total", package_help, "counter")
        for package, count in packages.items():
            package_fam.add(float(count), package=str(package))
        core_help = "Number of times this CPU core has been throttled."
        core_fam = Family("node_cpu_core_throttles_total", core_help, "counter")
        for package, package_cores in cores.items():
            for core, count in package_cores.items():
                core_fam.add(float(count), package=str(package), core=str(core))
        return [package_fam, core_fam]


def make() -> CpuCollector:
    return CpuCollector()
