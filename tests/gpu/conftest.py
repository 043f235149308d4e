"""Helpers for the GPU tests: agents on the fake NVML, the fixture scenarios, waiting on the trio clock."""

from __future__ import annotations

import functools
from pathlib import Path

from nvdaemon.app import Agent
from nvdaemon.compat.dcgm import pod_attributes, render_dcgm
from nvdaemon.configload import parse_config
from nvdaemon.gpu import GpuRuntime, open_gpu
from tests.polling import until

ROOT = Path(__file__).resolve().parent.parent.parent
SCENARIOS = ROOT / "fixtures" / "nvml"
HEALTHY = SCENARIOS / "h100-8gpu-healthy.json"
XID79 = SCENARIOS / "h100-8gpu-xid79-lost.json"
THERMAL = SCENARIOS / "h100-8gpu-thermal-throttle.json"


def make_agent(tmp_path: Path, extra: str = "", tiers: str = "[gpu]", scenario: Path | str = HEALTHY) -> Agent:
    text = (
        f"node: gpu-node\nstateDir: {tmp_path / 'state'}\nintervalSeconds: 0.05\ntiers: {tiers}\n"
        f"sinks: {{metrics: {{listenAddr: '127.0.0.1:0'}}, stream: {{enabled: false}}}}\n"
        f"gpu: {{backend: fake, fakeScenario: '{scenario}'}}\n{extra}"
    )
    return Agent(parse_config(text, "test.yaml", env={}))


def dcgm_text(agent: Agent) -> bytes:
    """The dcgm surface of this agent's latest gpu snapshot, from the values /metrics passes it."""
    rt = agent.gpu
    pa = rt.pod_attribution if rt is not None else None
    return render_dcgm(
        agent.snapshots.get("gpu"),
        enabled=agent.loaded.config.dcgm_compat.enabled,
        node=agent.node,
        last_xid=rt.last_xid if rt is not None else {},
        pods=pod_attributes(pa.current if pa is not None else None),
    )


async def open_agent_gpu(agent: Agent) -> GpuRuntime:
    """``open_gpu`` with the agent's config slice and callbacks, kept on the agent as ``Agent.run`` keeps it."""
    start = await open_gpu(
        agent.loaded.config.gpu, agent.active_tiers(), node=agent.node, emit=agent.emit, next_seq=agent.next_seq
    )
    assert start.runtime is not None and start.skipped_tiers == frozenset()
    agent.gpu = start.runtime
    return start.runtime


wait_until = functools.partial(until, timeout=10.0, step=0.01)
