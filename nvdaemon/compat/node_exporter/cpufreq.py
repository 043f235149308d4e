"""cpufreq: CPU frequencies from ``<sys>/devices/system/cpu/cpuN/cpufreq/`` (kHz in sysfs, served in hertz).

On a real host ``cpuN/cpufreq`` is a link to ``cpufreq/policyM``; a CPU without it (no cpufreq driver) is skipped.
Families, each labelled ``cpu`` (N): ``node_cpu_frequency_hertz`` (``cpuinfo_cur_freq``, readable by root only),
``node_cpu_frequency_{min,max}_hertz`` (``cpuinfo_{min,max}_freq``), ``node_cpu_scaling_frequency_hertz``
(``scaling_cur_freq``) and ``node_cpu_scaling_frequency_{min,max}_hertz`` (``scaling_{min,max}_freq``).

node_exporter 1.5 (procfs 0.8) is all-or-nothing here: a frequency file that is absent or not readable by us only
leaves its family out, but one that does not parse, or a missing ``scaling_driver``, ``scaling_governor``,
``scaling_available_governors``, ``related_cpus`` or ``scaling_setspeed`` (read though not served) fails the
whole collector before anything is sent.

The attributes the cpufreq driver sets once per policy (``cpuinfo_min_freq``, ``cpuinfo_transition_latency``,
``scaling_available_governors``, ``scaling_driver``, ``related_cpus``) are read once per policy directory through
``StaticAttrs``: five of the twelve files per CPU. What an administrator writes (``scaling_{min,max}_freq``,
``scaling_governor``, ``scaling_setspeed``) and ``cpuinfo_max_freq`` (which follows the boost / ``no_turbo``
switches) are read every scrape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvdaemon.collectors.base import NotPresent, ParseError
from nvdaemon.collectors.static_attrs import DeviceAttrs, StaticAttrs
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.cpu import cpu_dirs
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.goparse import parse_uint, trim_space

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
# Fixed for the life of a policy directory (the driver sets them when it creates the policy). Not
# cpuinfo_max_freq: intel_pstate's no_turbo and the cpufreq boost switch change it.
FIXED = frozenset(
    {"cpuinfo_min_freq", "cpuinfo_transition_latency", "scaling_available_governors", "scaling_driver", "related_cpus"}
)
# Anchored at cpuN/cpufreq (followed to the policyM directory it links to): 40 of 96 reads a scrape fewer on
# gpunode, 0.87 -> 0.53 ms CPU.
POLICIES = StaticAttrs()


@dataclass
class CpuFreq:
    cpu: str  # the N of cpuN, as the directory spells it
    khz: dict[str, int] = field(default_factory=dict)  # file name -> value, only those present and readable


def _khz(ctx: NodeContext, policy: DeviceAttrs, name: str) -> int | None:
    """procfs's ReadUintFromFile of one frequency file; None when it is absent or root-only (cpuinfo_cur_freq)."""
    path = f"{policy.directory}/{name}"
    try:
        text = policy.read(name) if name in FIXED else ctx.read(path)
    except (NotPresent, PermissionError):
        return None
    if text is None:
        return None
    try:
        return parse_uint(trim_space(text))  # one that does not parse fails the collector
    except ParseError as exc:
        raise ParseError(f"{path}: {exc}") from None


def read_policy(ctx: NodeContext, cpu: str, policy: DeviceAttrs) -> CpuFreq:
    """One CPU's cpufreq directory; raises on what makes node_exporter fail."""
    stats = CpuFreq(cpu)
    for name in (*FREQUENCIES, *_UNSERVED_UINT):
        khz = _khz(ctx, policy, name)
        if khz is not None:
            stats.khz[name] = khz
    for name in REQUIRED_TEXT:  # NoData or OSError propagate: the collector fails
        if name not in FIXED:
            ctx.read(f"{policy.directory}/{name}")
        elif policy.read(name) is None:
            raise NotPresent(f"{policy.directory}/{name}")
    return stats


def read_all(ctx: NodeContext) -> list[CpuFreq]:
    out: list[CpuFreq] = []
    for cpu_dir in cpu_dirs(ctx):
        try:
            policy = POLICIES.device(f"{cpu_dir}/cpufreq")  # stats through the policy link, as Go's os.Stat does
        except NotPresent:
            continue  # this CPU has no cpufreq driver
        out.append(read_policy(ctx, cpu_dir.name.removeprefix("cpu"), policy))
    return out


def collect(ctx: NodeContext, out: list[Family]) -> None:
    stats = read_all(ctx)  # everything is read before anything is sent
    families = {name: Family(fam, help_, "gauge") for name, (fam, help_) in FREQUENCIES.items()}
    for cpu in stats:
        for name, family in families.items():
            if name in cpu.khz:
                family.add(cpu.khz[name] * 1000.0, cpu=cpu.cpu)
    out.extend(families.values())
