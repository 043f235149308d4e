"""Helpers for the GPU tests: agents on the fake NVML, the fixture scenarios, waiting on the trio clock."""

from __future__ import annotations

import functools
from pathlib import Path

from nvdaemon.app import Agent
from nvdaemon.config import parse_config
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


wait_until = functools.partial(until, timeout=10.0, step=0.01)
