"""Strings NVML gives become labels: each is cut to a bounded length whichever backend gave it. Through the fake
backend (a scenario with huge strings) to the gpu tier's samples, the dcgm surface and open_gpu's driver version,
and through the real backend over a recording stand-in of pynvml answering huge bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nvdaemon.collectors.base import HostRoots
from nvdaemon.configload import parse_config
from nvdaemon.gpu import GpuRuntime, open_gpu
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.nvml.real import RealNvml
from tests.gpu.conftest import HEALTHY
from tests.gpu.recorder import RecordingNvml

TEXT_MAX = 256  # the documented bound on one NVML string
HUGE = 4 * 1024 * 1024


def huge_scenario() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(HEALTHY.read_text())
    doc["driverVersion"] = "9" * HUGE
    dev = doc["devices"][0]
    dev["name"] = "NVIDIA " + "H" * HUGE
    dev["uuid"] = "GPU-" + "0" * HUGE
    dev["pciBusId"] = "0000:" * (HUGE // 5)
    dev["mig"] = [f"MIG-{i:08d}-" + "f" * 1000 for i in range(10_000)]
    return doc


async def test_huge_fake_strings_are_cut_before_they_are_labels(tmp_path: Path) -> None:
    scenario = tmp_path / "huge.json"
    scenario.write_text(json.dumps(huge_scenario()))
    text = f"node: n\ntiers: [gpu]\ngpu: {{backend: fake, fakeScenario: '{scenario}'}}\n"
    config = parse_config(text, "test.yaml", env={})
    start = await open_gpu(config.config.gpu, ["gpu"], node="n", emit=lambda events: None, next_seq=lambda: 1)
    rt = start.runtime
    assert isinstance(rt, GpuRuntime) and isinstance(rt.backend, FakeNvml)
    assert len(rt.driver_version) == TEXT_MAX
    ident = rt.identities[0]
    assert (len(ident.name), len(ident.uuid), len(ident.pci_bus_id)) == (TEXT_MAX, TEXT_MAX, TEXT_MAX)
    assert ident.name.startswith("NVIDIA HHH")
    assert 0 < len(ident.mig_uuids) <= 64 and max(len(u) for u in ident.mig_uuids) <= TEXT_MAX

    (collector,) = rt.collectors()
    samples = collector.interpret(collector.gather(HostRoots()), 1.0).samples
    values = [v for s in samples for _, v in s.labels]
    assert values and max(len(v) for v in values) <= TEXT_MAX


def test_huge_pynvml_strings_are_cut() -> None:
    class Huge(RecordingNvml):
        def nvmlDeviceGetName(self, handle: object) -> bytes:  # type: ignore[override]  # older bindings: bytes
            return b"NVIDIA " + b"\xe2\x82\xac" * HUGE

        def nvmlSystemGetDriverVersion(self) -> str:
            return "5" * HUGE

    backend = RealNvml(Huge(gpus=1))
    (ident,) = backend.open()
    assert len(ident.name) == TEXT_MAX and ident.name.startswith("NVIDIA €€")
    assert len(backend.driver_version()) == TEXT_MAX
