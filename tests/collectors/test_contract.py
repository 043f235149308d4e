"""Every row of the Go agent's metric catalogue (nodevitals-contract.md §2) on the fixture hosts, as exposed on
/metrics: name, TYPE, device string and label keys.

The samples come from the real collectors (core on the healthy, faulty and gpunode hosts with a second cpu tick;
smart through pySMART and the smartctl stand-in; gpu on the fake NVML of the throttling H100 scenario) and are
rendered by the agent's own exposition, then parsed back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nvdaemon.app import Agent
from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import HostRoots, NotPresent
from nvdaemon.collectors.gpu import gpu_samples
from nvdaemon.configload import parse_config
from nvdaemon.model import Sample, TierSnapshot
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.server.metrics import MetricsCache
from tests.collectors.conftest import HOSTS, NOW
from tests.gpu.conftest import THERMAL
from tests.smart.conftest import collector, cycle


@dataclass(frozen=True)
class Row:
    tier: str
    metric: str
    counter: bool
    device: str  # a regular expression every device of the series matches
    labels: frozenset[str] = frozenset()  # sample labels beyond node, tier, device


PCI = r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
GPU_LABELS = frozenset({"gpu_uuid", "gpu_model", "pci_bus_id"})


def rows(tier: str, metrics: str, counter: bool, device: str, labels: frozenset[str] = frozenset()) -> list[Row]:
    return [Row(tier, m, counter, device, labels) for m in metrics.split()]


CONTRACT: list[Row] = [
    *rows("core", "load1", False, "cpu"),
    *rows("core", "cpu_util_pct", False, r"cpu[0-9]*"),
    *rows("core", "mem_total_bytes mem_available_bytes mem_used_bytes swap_used_bytes", False, "mem"),
    *rows("core", "net_rx_bytes_total net_tx_bytes_total net_rx_errors_total net_tx_errors_total", True, r"(?!lo$).+"),
    *rows(
        "core", "disk_read_bytes_total disk_write_bytes_total disk_read_ios_total disk_write_ios_total", True, r"\S+"
    ),
    *rows("core", "temp_celsius", False, r"hwmon[0-9]+/[^/]+/temp[0-9]+"),
    *rows("core", "fan_rpm", False, r"hwmon[0-9]+/[^/]+/fan[0-9]+"),
    *rows(
        "core",
        "psi_stall_ratio_avg10 psi_stall_ratio_avg60 psi_stall_ratio_avg300",
        False,
        "cpu|memory|io|irq",  # irq is ours in addition
        frozenset({"share"}),
    ),
    *rows("core", "psi_stall_seconds_total", True, "cpu|memory|io|irq", frozenset({"share"})),
    *rows("core", "power_energy_joules_total", True, r"intel-rapl:[0-9]+(:[0-9]+)?", frozenset({"zone"})),
    *rows(
        "core",
        "pcie_aer_correctable_total pcie_aer_nonfatal_total pcie_aer_fatal_total",
        True,
        PCI,
        frozenset({"error_type"}),
    ),
    *rows(
        "smart",
        "smart_temperature_celsius smart_power_on_hours smart_power_cycles smart_reallocated_sectors "
        "smart_reported_uncorrectable smart_command_timeout smart_pending_sectors smart_offline_uncorrectable "
        "smart_health_passed smart_error_log_count smart_capacity_bytes smart_logical_block_size_bytes "
        "smart_rotation_rate_rpm smart_interface_speed_bits_per_second nvme_percentage_used nvme_available_spare "
        "nvme_available_spare_threshold nvme_media_errors nvme_critical_warning nvme_bytes_read_total "
        "nvme_bytes_written_total nvme_error_log_entries",
        False,  # every smart-tier metric is a gauge
        r"sd[a-z]+|nvme[0-9]+n[0-9]+",
    ),
    *rows(
        "gpu",
        "gpu_utilization_pct gpu_mem_used_bytes gpu_mem_total_bytes gpu_temperature_celsius gpu_power_watts "
        "gpu_throttle_reasons gpu_mem_free_bytes gpu_mem_reserved_bytes gpu_mem_copy_util_pct gpu_encoder_util_pct "
        "gpu_decoder_util_pct gpu_sm_clock_mhz gpu_mem_clock_mhz gpu_memory_temperature_celsius gpu_row_remap_failed",
        False,
        r"gpu[0-9]+",
        GPU_LABELS,
    ),
    *rows(
        "gpu",
        "gpu_ecc_uncorrected_total gpu_ecc_corrected_total gpu_pcie_replay_total gpu_energy_joules_total "
        "gpu_remapped_rows_corrected_total gpu_remapped_rows_uncorrected_total",
        True,
        r"gpu[0-9]+",
        GPU_LABELS,
    ),
    *rows("gpu", "gpu_throttle_active", False, r"gpu[0-9]+", GPU_LABELS | {"reason"}),
]


def test_the_table_is_the_contract() -> None:
    """One row per metric of the contract's lists: 24 core, 22 smart, 21 + 1 gpu."""
    assert len({r.metric for r in CONTRACT}) == len(CONTRACT) == 68
    assert [len([r for r in CONTRACT if r.tier == t]) for t in ("core", "smart", "gpu")] == [24, 22, 22]


def _second_cpu_tick(host: Path, tmp_path: Path) -> HostRoots:
    """A copy of the host's /proc/stat with every cpu line moved on (busy and idle), so cpu_util_pct exists."""
    root = tmp_path / host.name
    (root / "proc").mkdir(parents=True)
    lines = []
    for line in (host / "proc" / "stat").read_text().splitlines():
        f = line.split()
        if f and re.fullmatch(r"cpu[0-9]*", f[0]):
            f[1:5] = [str(int(f[1]) + 30), f[2], f[3], str(int(f[4]) + 70)]
        lines.append(" ".join(f))
    (root / "proc" / "stat").write_text("\n".join(lines) + "\n")
    return HostRoots(proc=root / "proc", sys=host / "sys", dev=host / "dev", rootfs=root)


def _core_samples(host: Path, tmp_path: Path) -> list[Sample]:
    roots = HostRoots.under(host)
    out: list[Sample] = []
    for c in collectors_for_tier("core"):
        try:
            out += c.interpret(c.gather(roots), NOW).samples
        except NotPresent:  # gpunode has no PCI AER files
            continue
        if c.name == "cpu":  # the first tick is the baseline: percentages come from a second one
            second = c.interpret(c.gather(_second_cpu_tick(host, tmp_path)), NOW + 15).samples
            out += [s for s in second if s.metric.endswith("_pct")]
    return out


@dataclass(frozen=True)
class Exposed:
    type: str
    samples: list[dict[str, str]]


def exposition(tmp_path: Path, snapshots: dict[str, list[Sample]], out: dict[str, Exposed]) -> None:
    """Add ``/metrics`` as the agent renders it to ``out``, by sample name (``nodevitals_hw_`` prefix removed)."""
    agent = Agent(parse_config(f"node: n1\nstateDir: {tmp_path / 'state'}\n", "test.yaml", env={}))
    for tier, samples in snapshots.items():
        agent.on_snapshot(TierSnapshot(tier, samples, {}, collected_at=NOW, duration=0.0))
    text = MetricsCache(agent).render().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("nodevitals_hw_"):
                name = s.name.removeprefix("nodevitals_hw_")
                out.setdefault(name, Exposed(family.type, [])).samples.append(s.labels)
    # TYPE lines as written, which the parser normalises for counters.
    for m in re.finditer(r"^# TYPE nodevitals_hw_(\S+) (\S+)$", text, re.M):
        assert m.group(1) in out and out[m.group(1)].type == m.group(2), m.group(0)


@pytest.fixture(scope="module")
def gpu_tier() -> list[Sample]:
    nvml = FakeNvml(THERMAL)
    nvml.open()
    nvml.device_count()  # tick 0 of the scenario
    count = nvml.device_count()  # tick 1: gpu2 and gpu5 throttle
    samples = [s for i in range(count) for s in gpu_samples(nvml.snapshot(i), NOW)]
    assert [s.device for s in samples if s.metric == "gpu_throttle_active" and s.value] == ["gpu2", "gpu5", "gpu5"]
    return samples


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory, gpu_tier: list[Sample]) -> dict[str, Exposed]:
    tmp_path = tmp_path_factory.mktemp("contract")
    out: dict[str, Exposed] = {}
    for host in ("healthy", "faulty", "gpunode"):
        exposition(tmp_path / host, {"core": _core_samples(HOSTS / host, tmp_path / host)}, out)
    with pytest.MonkeyPatch.context() as mp:  # the smartctl stand-in answers every disk from its recordings
        mp.setenv("SMARTCTL_STANDIN_LOG", str(tmp_path / "smartctl.log"))
        mp.delenv("SMARTCTL_STANDIN_MODE", raising=False)
        mp.delenv("SMARTCTL_STANDIN_DIR", raising=False)
        gathered, smart = cycle(collector())
    assert gathered.errors == []
    exposition(tmp_path, {"smart": smart, "gpu": gpu_tier}, out)
    return out


@pytest.mark.parametrize("row", CONTRACT, ids=lambda r: r.metric)
def test_contract_row(row: Row, exposed: dict[str, Exposed]) -> None:
    assert row.metric in exposed, f"{row.metric} is not on /metrics"
    series = exposed[row.metric]
    assert series.type == ("counter" if row.counter else "gauge")
    for labels in series.samples:
        assert set(labels) == {"node", "tier", "device"} | row.labels, labels
        assert labels["tier"] == row.tier
        assert re.fullmatch(row.device, labels["device"]), labels["device"]


def test_disk_devices_are_every_diskstats_line(exposed: dict[str, Exposed]) -> None:
    names = {
        line.split()[2]
        for host in ("healthy", "faulty", "gpunode")
        for line in (HOSTS / host / "proc" / "diskstats").read_text().splitlines()
        if line.strip()
    }
    for metric in ("disk_read_bytes_total", "disk_write_bytes_total", "disk_read_ios_total", "disk_write_ios_total"):
        assert {s["device"] for s in exposed[metric].samples} == names


def test_go_devices_are_all_there(exposed: dict[str, Exposed]) -> None:
    def devices(metric: str) -> set[str]:
        return {s["device"] for s in exposed[metric].samples}

    assert devices("cpu_util_pct") >= {"cpu", "cpu0", "cpu1"}
    assert {"cpu", "memory", "io"} <= devices("psi_stall_ratio_avg10")
    assert {s["share"] for s in exposed["psi_stall_seconds_total"].samples} == {"some", "full"}
    assert "hwmon0/coretemp/temp1" in devices("temp_celsius")
    assert "hwmon2/nct6775/fan1" in devices("fan_rpm")
    assert devices("smart_rotation_rate_rpm") == {"sdb"}  # > 0 only: sda is solid state
    assert {s["reason"] for s in exposed["gpu_throttle_active"].samples} == {
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
    # No name of the contract gained a suffix: the smart tier's gauges are exposed under their own names.
    assert not [name for name in exposed if name.endswith("_total_total") or name == "smart_power_on_hours_total"]
