"""cpufreq: CPU frequencies from ``<sys>/devices/system/cpu/cpuN/cpufreq/`` (kHz in sysfs, served in hertz).

On a real host ``cpuN/cpufreq`` is a link to ``cpufreq/policyM``; a CPU without it (no cpufreq driver) is skipped.
Families, each labelled ``cpu`` (N): ``node_cpu_frequency_hertz`` (``cpuinfo_cur_freq``, readable by root only),
``node_cpu_frequency_{min,max}_hertz`` (``cpuinfo_{min,max}_freq``), ``node_cpu_scaling_frequency_hertz``
(``scaling_cur_freq``) and ``node_cpu_scaling_frequency_{min,max}_hertz`` (``scaling_{min,max}_freq``).

node_exporter 1.5 (procfs 0.8) is all-or-nothing here: a frequency file that is absent or not readable by us only
leaves its family out, but one that does not parse, or a missing ``scaling_driver``, ``scaling_governor``,
``scaling_available_governors``, ``related_cpus`` or ``scaling_setspeed`` (read though not served) fails the
whole collector before anything is sent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nvdaemon.collectors.base import NotPresent
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.cpu import cpu_dirs
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.compat.node_exporter.sysfs import read_int_file

# sysfs file -> (family, HELP); the order is the order node_exporter sends them in
FREQUENCIES: dict[str, tuple[str, str]] = {
    "cpuinfo_cur_freq": ("node_cpu_frequency_hertz", "Current cpu thread frequency in hertz."),
    "cpuinfo_min_freq": ("node_cpu_frequency_min_hertz", "Minimum cpu thread frequency in hertz."),
    "cpuinfo_max_freq": ("node_cpu_frequency_max_hertz", "Maximum cpu thread frequency in hertz."),
    "scaling_cur_freq": ("node_cpu_scaling_frequency_hertz", "Current scaled CPU thread frequency in hertz."),
    "scaling_min_freq": ("node_cpu_scaling_frequency_min_hertz", "Minimum scaled CPU thread frequency in hertz."),
    "scaling_max_freq": ("node_cpu_scaling_frequency_max_hertz", "Maximum scaled CPU thread frequency in hertz."),
}
# Read and parsed by procfs although no family uses it: a bad value still fails the collector.
_UNSERVED_UINT = ("cpuinfo_transition_latency",)
# Must exist and be readable (their text is not used).
REQUIRED_TEXT = (
    "scaling_available_governors",
    "scaling_driver",
    "scaling_governor",
    "related_cpus",
    "scaling_setspeed",
)


@dataclass
class CpuFreq:
    cpu: str  # the N of cpuN, as the directory spells it
    khz: dict[str, int] = field(default_factory=dict)  # file name -> value, only those present and readable


def read_policy(ctx: NodeContext, cpu: str, base: str) -> CpuFreq:
    """One CPU's cpufreq directory; raises on what makes node_exporter fail."""
    stats = CpuFreq(cpu)
    for name in (*FREQUENCIES, *_UNSERVED_UINT):
        try:
            stats.khz[name] = read_int_file(ctx, f"{base}/{name}")  # one that does not parse fails the collector
        except (NotPresent, PermissionError):  # absent, or root-only (cpuinfo_cur_freq) and we are not root
            continue
    for name in REQUIRED_TEXT:
        ctx.read(f"{base}/{name}")  # NoData or OSError propagate: the collector fails
    return stats


def read_all(ctx: NodeContext) -> list[CpuFreq]:
    out: list[CpuFreq] = []
    for cpu_dir in cpu_dirs(ctx):
        cpufreq = f"{cpu_dir}/cpufreq"  # strings: no Path built per file of every CPU
        try:
            os.stat(cpufreq)  # follows the policy link, as Go's os.Stat does
        except FileNotFoundError:
            continue  # this CPU has no cpufreq driver
        out.append(read_policy(ctx, cpu_dir.name.removeprefix("cpu"), cpufreq))
    return out


def collect(ctx: NodeContext, out: list[Family]) -> None:
    stats = read_all(ctx)  # everything is read before anything is sent
    families = {name: Family(fam, help_, "gauge") for name, (fam, help_) in FREQUENCIES.items()}
    for cpu in stats:
        for name, family in families.items():
            if name in cpu.khz:
                family.add(cpu.khz[name] * 1000.0, cpu=cpu.cpu)
    out.extend(families.values())
