"""dcgmCompat: the dcgm-exporter surface of the healthy 8-GPU fixture, diffed against a golden file
(regenerate with NVDAEMON_UPDATE_GOLDEN=1) and checked with promtool."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nvdaemon.app import Agent
from nvdaemon.compat.dcgm import FAMILIES
from nvdaemon.nvml import XidNotice
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.gpu.conftest import dcgm_text, make_agent, open_agent_gpu

GOLDEN = Path(__file__).parent / "golden" / "dcgm.metrics"
# What promtool's linter says about dcgm-exporter's own names; a drop-in has to keep them.
INHERENT = (
    re.compile(r'^DCGM_FI_DEV_\w+ counter metrics should have "_total" suffix$'),
    re.compile(r"^DCGM_FI_DEV_\w+ label names should be written in 'snake_case' not 'camelCase'$"),
    re.compile(r"^DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'$"),
)


async def agent_with_one_tick(tmp_path: Path, enabled: bool = True) -> Agent:
    agent = make_agent(tmp_path, extra=f"dcgmCompat: {{enabled: {str(enabled).lower()}}}\n")
    rt = await open_agent_gpu(agent)
    runners = [CollectorRunner(c, rt.limiter) for c in rt.collectors()]
    agent.on_snapshot(await collect_tier("gpu", runners, agent.roots, 5.0))
    rt.on_xids([XidNotice(3, 79)], now=1.0)
    return agent


async def test_dcgm_surface_matches_golden_and_promtool_finds_only_dcgm_exporters_own_names(tmp_path: Path) -> None:
    agent = await agent_with_one_tick(tmp_path)
    body = dcgm_text(agent)
    text = body.decode()
    if os.environ.get("NVDAEMON_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "dcgm surface drifted; NVDAEMON_UPDATE_GOLDEN=1 regenerates"
    families = re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
    assert len(families) == 19 == len(FAMILIES) + 1
    assert all(len(re.findall(rf"^{name}{{", text, re.M)) == 8 for name, _ in families)
    assert (
        'DCGM_FI_DEV_XID_ERRORS{gpu="3",UUID="GPU-3e6f7b54-a085-4c3d-8f4b-8d9e0f1a2b34",pci_bus_id="00000000:5D:00.0",'
        'device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node",DCGM_FI_DRIVER_VERSION="550.90.07",'
        'err_code="79",err_msg="GPU has fallen off the bus"} 79' in text
    )
    assert 'err_code="0",err_msg="No Error"} 0' in text
    assert re.search(r'^DCGM_FI_DEV_FB_USED\{gpu="0",.*\} 71240$', text, re.M)  # MiB
    assert re.search(r'^DCGM_FI_DEV_POWER_USAGE\{gpu="0",.*\} 612.345000$', text, re.M)  # W, %f
    assert re.search(r'^DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION\{gpu="0",.*\} 184467440737$', text, re.M)  # mJ
    assert re.search(r'^DCGM_FI_DEV_VGPU_LICENSE_STATUS\{gpu="0",.*\} 0$', text, re.M)  # not answered here: 0
    full = MetricsCache(agent).render()
    assert full.endswith(body)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus); make test installs it as root")
    check = subprocess.run([promtool, "check", "metrics"], input=full, capture_output=True, check=False)
    findings = [line for line in (check.stdout + check.stderr).decode().splitlines() if line.strip()]
    assert check.returncode in (0, 3), findings  # 3: lint findings only, the exposition parsed
    unexpected = [f for f in findings if not any(p.match(f) for p in INHERENT)]
    assert unexpected == []
    assert findings, "dcgm-exporter's counters have no _total: promtool must say so, or the names changed"


async def test_nothing_unless_enabled(tmp_path: Path) -> None:
    agent = await agent_with_one_tick(tmp_path, enabled=False)
    assert dcgm_text(agent) == b""
    assert b"DCGM_FI_" not in MetricsCache(agent).render()
    assert b"nodevitals_hw_gpu_temperature_celsius{" in MetricsCache(agent).render()
