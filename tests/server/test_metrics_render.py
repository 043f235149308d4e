"""/metrics renders only when scraped, and only the parts whose input changed (``MetricsCache.renders`` counts each
part's renders); the text assembled from cached parts is the text a fresh render writes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
from quart import request

from nvdaemon.config import ServerConfig
from nvdaemon.model import CollectorStatus, Kind, Sample, TierSnapshot, make_labels
from nvdaemon.server import app as server_app
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.view import AgentView
from tests.server.fakeview import FakeView, make_view
from tests.server.raw import Conn, make_server_view, serving

SURFACES = "dcgmCompat: {enabled: true}\nsmartctlCompat: {enabled: true}\nnodeExporter: {enabled: true}\n"
TIER_PARTS = {"core": {"hw:core", "collectors:core", "node_exporter"}, "gpu": {"hw:gpu", "collectors:gpu", "dcgm"}}
# Parts without a version of their own, rendered on every scrape that finds the view changed.
ALWAYS = {"tiers", "self", "sinks", "kmsg", "process"}


def tick(view: FakeView, tier: str, value: float, at: float) -> None:
    samples = {
        "core": [
            Sample("load1", "cpu", value),
            Sample("psi_stall_seconds_total", "io", value, Kind.COUNTER, make_labels({"share": "some"})),
        ],
        "gpu": [Sample("gpu_temperature_celsius", "gpu0", value, labels=make_labels({"gpu_uuid": "GPU-0"}))],
        "smart": [Sample("smart_temperature_celsius", "sda", value)],
    }[tier]
    statuses = {f"{tier}-reader": CollectorStatus(f"{tier}-reader", success=True, duration=0.5, samples=1)}
    view.take(TierSnapshot(tier, samples, statuses, collected_at=at, duration=0.25))  # bumps snapshot_version


def stable(body: bytes) -> str:
    return "".join(line + "\n" for line in body.decode().splitlines() if not line.startswith("process_"))


def three_tiers(tmp_path: Path) -> tuple[FakeView, MetricsCache]:
    view = make_view(tmp_path, f"tiers: [core, gpu, smart]\n{SURFACES}")
    for tier in ("core", "gpu", "smart"):
        tick(view, tier, 1.0, at=100.0)
    return view, MetricsCache(view)


def test_ticks_without_a_scrape_render_nothing(tmp_path: Path) -> None:
    view, cache = three_tiers(tmp_path)
    assert cache.renders == Counter()  # nothing before the first scrape
    cache.render()
    before = cache.renders.copy()
    for i in range(5):
        tick(view, "core", 2.0 + i, at=110.0 + i)
        tick(view, "gpu", 2.0 + i, at=110.0 + i)
    assert cache.renders == before
    body = cache.render()  # one scrape after five ticks: each changed part once
    assert cache.renders - before == Counter({p: 1 for p in TIER_PARTS["core"] | TIER_PARTS["gpu"] | ALWAYS})
    assert 'nodevitals_hw_load1{device="cpu",node="n1",tier="core"} 6.0' in body.decode()


def test_a_scrape_after_one_tiers_tick_renders_only_that_tiers_parts(tmp_path: Path) -> None:
    view, cache = three_tiers(tmp_path)
    first = cache.render()
    assert set(cache.renders) == {
        *TIER_PARTS["core"],
        *TIER_PARTS["gpu"],
        *ALWAYS,
        "hw:smart",
        "collectors:smart",
        "smart",
        "smartctl",
    }
    assert set(cache.renders.values()) == {1}
    for tier in ("core", "gpu"):
        before = cache.renders.copy()
        tick(view, tier, 42.0, at=200.0)
        body = cache.render()
        assert cache.renders - before == Counter({p: 1 for p in TIER_PARTS[tier] | ALWAYS}), tier
        assert body != first
        # What was assembled from cached parts is what a fresh render of the same view writes.
        assert stable(body) == stable(MetricsCache(view).render())
    before = cache.renders.copy()
    again = cache.render()  # nothing changed: the same bytes, nothing rendered
    assert again is body and cache.renders == before


def test_an_event_or_a_change_renders_the_small_parts_only(tmp_path: Path) -> None:
    view, cache = three_tiers(tmp_path)
    cache.render()
    before = cache.renders.copy()
    view.update(changes=view.changes + 1)  # a sink's counters, a reload: nothing a tier gave
    cache.render()
    assert cache.renders - before == Counter(dict.fromkeys(ALWAYS, 1))


async def test_get_is_answered_before_quart_with_quarts_headers_and_head_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET /metrics is served in front of quart from the same cache a HEAD (through quart) uses: same headers."""
    reached_quart: list[str] = []
    real_build_app = server_app.build_app

    def counting_build_app(view: AgentView, server_config: ServerConfig, metrics: MetricsCache | None = None) -> Any:
        app = real_build_app(view, server_config, metrics)

        @app.before_request
        async def note() -> None:
            reached_quart.append(f"{request.method} {request.path}")

        return app

    monkeypatch.setattr(server_app, "build_app", counting_build_app)
    view = make_server_view(tmp_path, extra=SURFACES)
    tick(view, "core", 3.5, at=100.0)
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        status, headers, body = await conn.get("/metrics")
        again = await conn.get("/metrics")  # kept alive, the same cached bytes
        head = await Conn.open(host, port)
        await head.send(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        with trio.fail_after(10):
            reply = await head.closed_by_server()  # a HEAD answer has a head only
    status_line, *lines = reply.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    head_status = int(status_line.split()[1])
    head_headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    assert reached_quart == ["HEAD /metrics"]
    assert status == head_status == 200 and again == (status, headers, body)
    assert headers["content-type"] == head_headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["content-length"]) == len(body) == int(head_headers["content-length"])
    assert 'nodevitals_hw_load1{device="cpu",node="n1",tier="core"} 3.5\n' in body.decode()
    assert stable(body) == stable(MetricsCache(view).render())
