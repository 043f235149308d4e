"""A tier snapshot is a value: frozen, holding no collector, and unchanged by the cycles after it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

import msgspec
import pytest
import trio

from nvdaemon.collectors.base import Collector, Gathered, HostRoots, Interpreted, ParseError, ReadCounts, interpreted
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.surface import NodeExporterCollector, render_node_exporter
from nvdaemon.config import NodeExporterConfig
from nvdaemon.model import CollectorStatus, Sample, TierSnapshot
from nvdaemon.tiers import CollectorRunner, collect_tier

ROOTS = HostRoots()


class Flipping(Collector):
    """Healthy with one sample per tick, or broken when told to be."""

    name: ClassVar[str] = "flipping"

    def __init__(self) -> None:
        self.broken = False
        self.value = 1.0

    def gather(self, roots: HostRoots) -> Gathered:
        if self.broken:
            raise ParseError("/proc/flipping: line 1: bad")
        return Gathered(self.value)

    def interpret(self, gathered: Gathered, now: float) -> Interpreted:
        return interpreted([Sample("m", "d", gathered.data, timestamp=now)])


async def test_a_snapshot_cannot_be_changed() -> None:
    runner = CollectorRunner(Flipping(), trio.CapacityLimiter(1))
    snap = await collect_tier("core", [runner], ROOTS, 5.0)
    status = snap.collectors["flipping"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.samples = []  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.collected_at = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):  # the mapping is read-only
        snap.collectors["flipping"] = CollectorStatus("flipping")  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.success = False  # type: ignore[misc]
    with pytest.raises(AttributeError):  # a tuple: no append
        status.errors.append("later")  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        snap.results["flipping"] = interpreted([])  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.results["flipping"].samples = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snap.samples.append(Sample("m", "d", 2.0))  # type: ignore[attr-defined]
    assert isinstance(snap.reads, ReadCounts)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.reads.reads = 0  # type: ignore[misc]
    # No collector object anywhere in it.
    values = [getattr(snap, f.name) for f in dataclasses.fields(snap)]
    assert not any(isinstance(v, Collector) for v in values)
    assert not any(isinstance(v, Collector) for v in (*snap.results.values(), *snap.collectors.values()))


async def test_a_later_tick_does_not_change_an_earlier_snapshot() -> None:
    collector = Flipping()
    runner = CollectorRunner(collector, trio.CapacityLimiter(1))
    first = await collect_tier("core", [runner], ROOTS, 5.0)
    collector.broken = True
    second = await collect_tier("core", [runner], ROOTS, 5.0)
    collector.broken, collector.value = False, 3.0
    third = await collect_tier("core", [runner], ROOTS, 5.0)

    before, failed, after = (s.collectors["flipping"] for s in (first, second, third))
    assert (before.success, before.errors, before.error_total, before.samples) == (True, (), 0, 1)
    assert (failed.success, failed.errors, failed.error_total, failed.samples) == (
        False,
        ("ParseError: /proc/flipping: line 1: bad",),
        1,
        0,
    )
    assert (after.success, after.error_total) == (True, 1)
    assert runner.status is after
    # What each cycle produced stays with its snapshot: the failed one has no result, not the previous one.
    assert [s.value for s in first.samples] == [1.0] and first.results["flipping"].samples == tuple(first.samples)
    assert "flipping" not in second.results and second.samples == ()
    assert [s.value for s in third.samples] == [3.0]


def _textfile_collector(directory: Path) -> CollectorRunner:
    options = msgspec.convert({"enabled": True, "textfileDirectory": str(directory)}, NodeExporterConfig)
    ne = NodeExporterCollector("textfile", TABLE["textfile"]())
    ne.options = options
    return CollectorRunner(ne, trio.CapacityLimiter(1))


async def test_the_node_exporter_surface_renders_a_snapshot_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "site.prom").write_text("# TYPE site_jobs gauge\nsite_jobs 1\n")
    runner = _textfile_collector(tmp_path)
    first = await collect_tier("core", [runner], ROOTS, 30.0)
    shown = render_node_exporter(first, enabled=True)
    assert b"site_jobs 1\n" in shown
    (tmp_path / "site.prom").write_text("# TYPE site_jobs gauge\nsite_jobs 2\n")
    second = await collect_tier("core", [runner], ROOTS, 30.0)
    assert b"site_jobs 2\n" in render_node_exporter(second, enabled=True)
    assert render_node_exporter(first, enabled=True) == shown  # the collector's newer data is not the first's
    assert render_node_exporter(first, enabled=False) == b""
    assert render_node_exporter(None, enabled=True) == b""


def test_a_node_exporter_collector_without_a_result_this_cycle_is_not_successful() -> None:
    # The status says it ran (it timed out, say), the snapshot has no result for it: success 0 and no families,
    # known from the snapshot alone.
    status = CollectorStatus("node_exporter.textfile", errors=["read timed out after 5s"], duration=5.0)
    snap = TierSnapshot("core", [], {"node_exporter.textfile": status}, collected_at=1.0, duration=5.0)
    text = render_node_exporter(snap, enabled=True).decode()
    assert 'node_scrape_collector_success{collector="textfile"} 0\n' in text
    assert 'node_scrape_collector_duration_seconds{collector="textfile"} 5\n' in text
    assert "node_textfile" not in text
