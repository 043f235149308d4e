"""The smartctl_exporter surface and the smart self metrics read the smart tier's snapshot, not the collector."""

from __future__ import annotations

import trio

from nvdaemon.collectors.smart import SmartResult, smart_result
from nvdaemon.compat.smartctl import render_smartctl
from nvdaemon.server.smart_metrics import smart_self_metrics
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.smart.conftest import DISKS, Standin, collector


async def test_an_earlier_smart_snapshot_renders_as_it_was(standin: Standin) -> None:
    runner = CollectorRunner(collector(), trio.CapacityLimiter(1))
    first = await collect_tier("smart", [runner], DISKS, 30.0)
    shown = render_smartctl(first, enabled=True)
    assert b'smartctl_device_smart_status{device="sda"} 1\n' in shown
    standin.modes(sda="denied")
    second = await collect_tier("smart", [runner], DISKS, 30.0)
    assert b'smartctl_device_smart_status{device="sda"}' not in render_smartctl(second, enabled=True)
    assert render_smartctl(first, enabled=True) == shown

    first_result = smart_result({"smart": first})
    assert isinstance(first_result, SmartResult) and first_result.status["sda"].readable
    readable = next(m for m in smart_self_metrics({"smart": first}) if m.name == "nodevitals_smart_device_readable")
    assert {s.labels["device"]: s.value for s in readable.samples}["sda"] == 1.0
    later = next(m for m in smart_self_metrics({"smart": second}) if m.name == "nodevitals_smart_device_readable")
    assert {s.labels["device"]: s.value for s in later.samples}["sda"] == 0.0


def test_no_smart_result_renders_no_devices() -> None:
    assert b"smartctl_devices 0\n" in render_smartctl(None, enabled=True)
    assert render_smartctl(None, enabled=False) == b""
