"""/metrics rendered right after a tick while scrapes come about once a tick (``nvdaemon.server.render_ahead``), and
only then: the page a scrape gets is the one a render at the scrape would have made."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from nvdaemon.model import Sample, TierSnapshot
from nvdaemon.server import app as server_app
from nvdaemon.server import render_ahead
from nvdaemon.server.metrics import MetricsCache, ScrapeGaps
from nvdaemon.server.render_ahead import serve_render_ahead, ticked, worth_ahead
from nvdaemon.view import AgentView
from tests.server.fakeview import FakeView, make_view
from tests.server.raw import Conn, make_server_view, serving
from tests.server.test_metrics_render import SURFACES, stable, tick

INTERVAL = 10.0  # make_view's intervalSeconds (core and gpu)
GZIP = ["gzip"]


class Clock:
    """The cache's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("gap", "since", "interval", "ahead"),
    [
        (None, 1.0, 10.0, False),  # one scrape so far: no rate known
        (10.0, 1.0, 10.0, True),  # a scrape a tick
        (12.5, 12.5, 10.0, True),  # within the slack
        (12.6, 1.0, 10.0, False),  # scraped less often than it ticks
        (60.0, 1.0, 15.0, False),  # Prometheus at 60 s, ticks at 15 s: three pages of four for nobody
        (5.0, 1.0, 10.0, True),  # two scrapers
        (10.0, 13.0, 10.0, False),  # the scraper has gone quiet
        (10.0, float("inf"), 10.0, False),
        (200.0, 10.0, 300.0, True),  # the smart tier, scraped far more often than it ticks
    ],
)
def test_worth_ahead(gap: float | None, since: float, interval: float, ahead: bool) -> None:
    assert worth_ahead(gap, since, interval) is ahead


def test_ticked_names_the_tiers_with_another_snapshot() -> None:
    a, b, c = (TierSnapshot(t, [], {}, collected_at=1.0, duration=0.1) for t in ("core", "gpu", "core"))
    assert ticked({"core": a, "gpu": b}, {"core": c, "gpu": b}) == ["core"]
    assert ticked({"core": a}, {"core": a, "gpu": b}) == ["gpu"]  # a tier's first snapshot
    assert ticked({"core": a, "gpu": b}, {"core": a, "gpu": b}) == []


def test_scrape_gaps() -> None:
    clock = Clock()
    gaps = ScrapeGaps(clock)
    assert (gaps.last_gap, gaps.since_last()) == (None, float("inf"))
    gaps.note(gzip=False)
    clock.now += 15.0
    assert gaps.since_last() == 15.0
    gaps.note(gzip=True)
    clock.now += 2.0
    assert (gaps.last_gap, gaps.since_last(), gaps.last_gzip) == (15.0, 2.0, True)


def setup(tmp_path: Path) -> tuple[FakeView, MetricsCache, Clock]:
    view = make_view(tmp_path, f"tiers: [core, gpu]\n{SURFACES}")
    tick(view, "core", 1.0, at=100.0)
    tick(view, "gpu", 1.0, at=100.0)
    clock = Clock()
    return view, MetricsCache(view, clock=clock), clock


def scrape(cache: MetricsCache, clock: Clock, after: float, accept: list[str] = GZIP) -> bytes:
    clock.now += after
    return cache.answer(accept)[1]


async def test_renders_after_a_tick_when_scraped_once_a_tick(tmp_path: Path) -> None:
    view, cache, clock = setup(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_render_ahead, view, cache)
        scrape(cache, clock, 0.0)
        scrape(cache, clock, INTERVAL)
        renders, compressions = cache.renders.copy(), cache.compressions
        clock.now += 1.0
        tick(view, "core", 2.0, at=110.0)
        await trio.testing.wait_all_tasks_blocked()
        assert cache.renders["node_exporter"] == renders["node_exporter"] + 1  # made before any scrape asked
        assert cache.renders["hw:core"] == renders["hw:core"] + 1
        assert cache.renders["hw:gpu"] == renders["hw:gpu"]  # its snapshot did not change
        assert cache.compressions == compressions + 1  # the last scrape asked for gzip
        made = cache.renders.copy()
        body = scrape(cache, clock, INTERVAL - 1.0, accept=[])
        assert cache.renders == made  # the scrape found the page made
        assert stable(body) == stable(MetricsCache(view).render())  # as a render at the scrape writes it
        nursery.cancel_scope.cancel()


async def test_no_gzip_ahead_for_a_scraper_that_does_not_ask_for_it(tmp_path: Path) -> None:
    view, cache, clock = setup(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_render_ahead, view, cache)
        scrape(cache, clock, 0.0, accept=[])
        scrape(cache, clock, INTERVAL, accept=[])
        renders, compressions = cache.renders["node_exporter"], cache.compressions
        tick(view, "core", 2.0, at=110.0)
        await trio.testing.wait_all_tasks_blocked()
        assert (cache.renders["node_exporter"], cache.compressions) == (renders + 1, compressions)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("gaps", "since"),
    [
        ([], 1.0),  # never scraped
        ([0.0], 1.0),  # scraped once
        ([0.0, 6 * INTERVAL], 1.0),  # scraped every minute
        ([0.0, INTERVAL], 2 * INTERVAL),  # scraped once a tick, then no more
    ],
)
async def test_no_render_ahead_for_nobody(tmp_path: Path, gaps: list[float], since: float) -> None:
    view, cache, clock = setup(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_render_ahead, view, cache)
        for gap in gaps:
            scrape(cache, clock, gap)
        renders, compressions = cache.renders.copy(), cache.compressions
        clock.now += since
        for i in range(3):
            tick(view, "core", 2.0 + i, at=110.0 + i)
            tick(view, "gpu", 2.0 + i, at=110.0 + i)
            await trio.testing.wait_all_tasks_blocked()
        assert (cache.renders, cache.compressions) == (renders, compressions)
        nursery.cancel_scope.cancel()


async def test_a_failed_render_is_logged_once_and_left_to_the_scrape(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    view, cache, clock = setup(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_render_ahead, view, cache)
        scrape(cache, clock, 0.0)
        scrape(cache, clock, INTERVAL)
        tries: list[None] = []

        def failing(self: MetricsCache) -> bytes:
            tries.append(None)
            raise ZeroDivisionError("a render's bug")

        monkeypatch.setattr(MetricsCache, "_render", failing)
        with caplog.at_level(logging.WARNING, logger=render_ahead.__name__):
            for i in range(3):
                view.take(TierSnapshot("core", [Sample("load1", "cpu", 1.0)], {}, collected_at=110.0 + i, duration=0.1))
                await trio.testing.wait_all_tasks_blocked()
        assert len(tries) == 3  # tried after every tick, the same error each time
        failed = [r for r in caplog.records if "rendering /metrics after a tick failed" in r.getMessage()]
        assert len(failed) == 1
        with pytest.raises(ZeroDivisionError):  # the scrape renders again, and fails as it did
            scrape(cache, clock, 1.0)
        monkeypatch.undo()
        tick(view, "core", 3.0, at=120.0)  # the task still runs
        await trio.testing.wait_all_tasks_blocked()
        assert stable(scrape(cache, clock, 1.0, accept=[])) == stable(MetricsCache(view).render())
        nursery.cancel_scope.cancel()


async def test_the_server_renders_ahead_for_its_scraper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wired into ``serve_http``: after two scrapes (well within a tick of each other) a tick's page is rendered
    before the next scrape asks, and that scrape gets it."""
    caches: list[MetricsCache] = []

    class Recorded(MetricsCache):
        def __init__(self, view: AgentView) -> None:
            super().__init__(view)
            caches.append(self)

    monkeypatch.setattr(server_app, "MetricsCache", Recorded)
    view = make_server_view(tmp_path, extra=SURFACES)
    tick(view, "core", 1.0, at=100.0)
    async with serving(view) as (host, port):
        conn = await Conn.open(host, port)
        for _ in range(2):
            assert (await conn.get("/metrics", "Accept-Encoding: gzip\r\n"))[0] == 200
        (cache,) = caches
        renders, compressions = cache.renders["node_exporter"], cache.compressions
        tick(view, "core", 2.0, at=110.0)
        await trio.testing.wait_all_tasks_blocked()
        assert (cache.renders["node_exporter"], cache.compressions) == (renders + 1, compressions + 1)
        status, _, body = await conn.get("/metrics")
        assert status == 200 and cache.renders["node_exporter"] == renders + 1
        assert 'nodevitals_hw_load1{device="cpu",node="n1",tier="core"} 2.0\n' in body.decode()
        await conn.aclose()
