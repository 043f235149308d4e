"""The table of collectors: name -> (tier, factory, enabled by default), and fresh instances per tier.

Every collector module is imported here eagerly, so importing this package yields the complete table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nvdaemon.collectors.base import Collector
from nvdaemon.collectors.cpu import CpuCollector
from nvdaemon.collectors.diskstats import DiskStatsCollector
from nvdaemon.collectors.gpu import GpuCollector
from nvdaemon.collectors.hwmon import HwmonCollector
from nvdaemon.collectors.loadavg import LoadAvgCollector
from nvdaemon.collectors.memory import MemoryCollector
from nvdaemon.collectors.netdev import NetDevCollector
from nvdaemon.collectors.pcie_aer import PcieAerCollector
from nvdaemon.collectors.pressure import PressureCollector
from nvdaemon.collectors.rapl import RaplCollector
from nvdaemon.collectors.smart import SmartCollector


@dataclass(frozen=True)
class CollectorSpec:
    name: str
    tier: str
    factory: Callable[[], Collector]
    default_enabled: bool = True
    description: str = ""  # one line: which files it reads


COLLECTORS: tuple[CollectorSpec, ...] = (
    CollectorSpec("loadavg", "core", LoadAvgCollector, description="/proc/loadavg"),
    CollectorSpec("cpu", "core", CpuCollector, description="/proc/stat (cpu lines, ctxt, intr, processes)"),
    CollectorSpec("memory", "core", MemoryCollector, description="/proc/meminfo"),
    CollectorSpec("netdev", "core", NetDevCollector, description="/proc/net/dev"),
    CollectorSpec("diskstats", "core", DiskStatsCollector, description="/proc/diskstats, /sys/block"),
    CollectorSpec("hwmon", "core", HwmonCollector, description="/sys/class/hwmon/hwmon*/{name,*_input,*_label}"),
    CollectorSpec("pressure", "core", PressureCollector, description="/proc/pressure/{cpu,memory,io,irq}"),
    CollectorSpec("rapl", "core", RaplCollector, description="/sys/class/powercap/intel-rapl:*/{name,energy_uj}"),
    CollectorSpec(
        "pcie_aer", "core", PcieAerCollector, description="/sys/bus/pci/devices/*/aer_dev_{correctable,nonfatal,fatal}"
    ),
    # Bound to the opened NVML backend by the GPU runtime (nvdaemon/gpu); unbound it reports "not present".
    CollectorSpec("nvml", "gpu", GpuCollector, description="NVML (nvidia-ml-py), one snapshot per GPU"),
    # pySMART over smartctl (smart.smartctlPath), whole disks under devRoot or smart.devices; configured from smart.*
    CollectorSpec("smart", "smart", SmartCollector, description="smartctl --all per disk, through pySMART"),
)


def collectors_for_tier(tier: str) -> list[Collector]:
    """Fresh instances of the enabled-by-default collectors of ``tier``, in table order."""
    return [spec.factory() for spec in COLLECTORS if spec.tier == tier and spec.default_enabled]


__all__ = ["COLLECTORS", "CollectorSpec", "collectors_for_tier"]
