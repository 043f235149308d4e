"""The sender's retry policy, on a virtual clock (``autojump_clock``, which stands still while the sqlite spool works
in its worker thread; an in-process httpx transport): backoff, Retry-After, order, dead letters, 410, maxAge,
timeouts, the shutdown drain."""

from __future__ import annotations

import email.utils
import itertools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from nvdaemon.config import SpoolConfig
from nvdaemon.exposition import render
from nvdaemon.sinks.spool_clock import SteadyClock
from nvdaemon.sinks.webhook import signing
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.http import retry_after
from nvdaemon.sinks.webhook.spool import DEAD, FILE, SpoolDB
from nvdaemon.sinks.webhook.spool_io import Spool
from nvdaemon.sinks.webhook.url import endpoint_names

from .helpers import SECRET, Script, event, hook, running, until

URL = "https://receiver.example:8443/hooks/hw?token=do-not-show"
Handler = Callable[[httpx.Request], Awaitable[httpx.Response]]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def test_backoff_is_capped_exponential_with_full_jitter(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script(lambda seq, n: httpx.Response(503 if n <= 6 else 200))
    h = hook(URL, backoffBaseSeconds=1, backoffMaxSeconds=4)
    async with running(tmp_path, h, transport=script.transport(), jitter=lambda: 0.5) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: script.delivered == [1], timeout=100)
        assert gaps(script.times(1)) == pytest.approx([0.5, 1, 2, 2, 2, 2])  # jitter 0.5 x min(4, 1·2^n)
        assert sink.attempts == {"retryable": 6, "success": 1}
        assert sink.state()["state"] == "active" and sink.state()["lastError"] is None


async def test_retry_after_seconds_and_http_date_are_honoured(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    def wall() -> float:
        return 1_700_000_000.0 + trio.current_time()

    def answer(seq: int, n: int) -> httpx.Response:
        if n == 1:
            return httpx.Response(503, headers={"Retry-After": "7"})
        if n == 2:
            return httpx.Response(429, headers={"Retry-After": email.utils.formatdate(wall() + 30, usegmt=True)})
        if n == 3:
            return httpx.Response(408)
        return httpx.Response(204)

    script = Script(answer)
    h = hook(URL, backoffBaseSeconds=1, backoffMaxSeconds=300)
    async with running(tmp_path, h, transport=script.transport(), wall=wall) as (_sink, bus):
        bus.publish(event(1))
        await until(lambda: script.delivered == [1], timeout=100)
    g = gaps(script.times(1))
    assert g[0] == pytest.approx(7)
    assert 29 <= g[1] <= 30  # an HTTP date has whole seconds
    assert g[2] == pytest.approx(4)  # third failure in a row, no header: 1 s x 2^2 (jitter 1)


def test_retry_after_parsing() -> None:
    assert retry_after("12", 0) == 12
    assert retry_after("999999", 0) == 3600  # capped
    assert retry_after("soon", 0) is None
    assert retry_after(None, 0) is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 0) == 3600
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 2e9) == 0


async def test_a_later_event_never_overtakes_an_earlier_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script(lambda seq, n: httpx.Response(500 if seq == 1 and n <= 3 else 200))
    h = hook(URL, backoffBaseSeconds=1, backoffMaxSeconds=300)
    async with running(tmp_path, h, transport=script.transport(), wall=trio.current_time) as (sink, bus):
        for i in range(1, 6):
            bus.publish(event(i))
        await until(lambda: len(script.delivered) == 5, timeout=100)
    assert script.delivered == [1, 2, 3, 4, 5]
    assert [s for _, s, _ in script.calls] == [1, 1, 1, 1, 2, 3, 4, 5]
    # One id per event on every attempt; a fresh timestamp per attempt; each signature verifies.
    firsts = [c[2] for c in script.calls if c[1] == 1]
    assert {h["webhook-id"] for h in firsts} == {event(1).id}
    assert len({h["webhook-timestamp"] for h in firsts}) == 4, [(c[0], c[2]["webhook-timestamp"]) for c in script.calls]
    assert all(h["webhook-signature"].startswith("v1,") for h in firsts)
    assert sink.backlog == 0


async def test_other_4xx_is_dead_lettered_after_max_attempts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script(lambda seq, n: httpx.Response(400 if seq == 1 else 200))
    async with running(tmp_path, hook(URL, maxAttempts=3), transport=script.transport()) as (sink, bus):
        bus.publish(event(1))
        bus.publish(event(2))
        await until(lambda: script.delivered == [2], timeout=100)
        assert len(script.times(1)) == 3
        assert sink.dropped == {"rejected": 1}
        assert sink.state()["deadLetters"] == 1 and sink.state()["backlog"] == 0
    (dead,) = SpoolDB(tmp_path / FILE).rows(DEAD)
    assert (dead.event_id, dead.dead_reason, dead.attempts, dead.last_error) == (event(1).id, "rejected", 3, "HTTP 400")


async def test_transient_failures_retry_until_max_age_then_dead_letter(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    def wall() -> float:
        return 1_700_000_000.0 + trio.current_time()

    script = Script(lambda seq, n: httpx.Response(503 if seq == 1 else 200))
    h = hook(URL, maxAgeHours=0.001, backoffBaseSeconds=1, backoffMaxSeconds=1)  # 3.6 s
    steady = SteadyClock("boot", trio.current_time)  # ages are measured on the steady clock: virtual time here
    async with running(tmp_path, h, transport=script.transport(), wall=wall, clock=steady) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: sink.dropped == {"expired": 1}, timeout=100)
        assert script.times(1) == pytest.approx([0, 1, 2, 3], abs=0.01)  # at 4 s it is older than 3.6 s
        bus.publish(event(2))  # a fresh event is delivered: the endpoint itself is not given up on
        await until(lambda: script.delivered == [2], timeout=100)
    (dead,) = SpoolDB(tmp_path / FILE).rows(DEAD)
    assert (dead.event_id, dead.dead_reason) == (event(1).id, "expired")


async def test_410_disables_the_endpoint_until_spool_retry(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    gone = [True]
    script = Script(lambda seq, n: httpx.Response(410 if gone[0] else 200))
    async with running(tmp_path, hook(URL), transport=script.transport()) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: sink.state()["state"] == "disabled", timeout=100)
        bus.publish(event(2))
        await trio.sleep(60)
        assert len(script.calls) == 1  # nothing more is sent to a gone endpoint...
        assert sink.backlog == 2  # ...but events keep being spooled
        assert sink.state()["lastError"] == "HTTP 410"
        assert any("endpoint_disabled" in line and line.endswith(" 1.0") for line in exposition(sink))
    # Disabled for this URL across restarts.
    async with running(tmp_path, hook(URL), transport=script.transport()) as (sink, _bus):
        await trio.sleep(60)
        assert len(script.calls) == 1 and sink.state()["state"] == "disabled"
        gone[0] = False
        assert SpoolDB(tmp_path / FILE).retry() == 0  # the operator: `nvdaemon spool retry`
        await until(lambda: script.delivered == [1, 2], timeout=100)
        assert sink.state()["state"] == "active"


async def test_a_request_that_never_answers_times_out(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    script = Script(lambda seq, n: None if n == 1 else httpx.Response(200))
    async with running(tmp_path, hook(URL, timeoutSeconds=3), transport=script.transport()) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: script.delivered == [1], timeout=100)
        assert sink.attempts == {"timeout": 1, "success": 1}
    assert gaps(script.times(1))[0] == pytest.approx(6 + 0.05)  # the whole-request bound, then backoff


async def test_events_published_right_before_shutdown_reach_the_spool(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    script = Script(lambda seq, n: None)  # nothing is ever delivered
    async with running(tmp_path, hook(URL), transport=script.transport()) as (_sink, bus):
        for i in range(50):
            bus.publish(event(i))
        # No checkpoint between publishing and the cancellation at the end of the block.
    assert len(SpoolDB(tmp_path / FILE).rows()) == 50


async def test_spool_overflow_is_counted_per_reason(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    script = Script(lambda seq, n: None)
    spool = SpoolConfig(max_events=3)
    async with running(tmp_path, hook(URL), transport=script.transport(), spool=spool) as (sink, bus):
        for i, sev in enumerate(["critical", "info", "warning", "critical", "info"]):
            bus.publish(event(i, severity=sev))
        await until(lambda: sink.dropped.get("spool_full_events") == 2)
        assert sink.backlog == 3
        assert 'nodevitals_webhook_dropped_total{reason="spool_full_events",sink="webhook:test"} 2.0' in exposition(
            sink
        )
    left = [r.event_id for r in SpoolDB(tmp_path / FILE).rows()]
    assert left == [event(0).id, event(2).id, event(3).id]  # the two info events went first


def exposition(sink: WebhookEndpoint) -> list[str]:
    return render(sink.metrics()).splitlines()


async def test_metrics_and_state_name_only_host_and_port(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    url = "https://user:pa55word@receiver.example:8443/hooks/hw?token=do-not-show"
    (name,) = endpoint_names([url])
    assert name == "webhook:receiver.example:8443"
    script = Script(lambda seq, n: httpx.Response(200))
    async with running(tmp_path, hook(url), transport=script.transport(), name=name) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: script.delivered == [1])
        text = "\n".join(exposition(sink))
        state = repr(sink.state())
    for line in (
        'nodevitals_delivery_attempts_total{outcome="success",sink="webhook:receiver.example:8443"} 1.0',
        'nodevitals_delivery_backlog{sink="webhook:receiver.example:8443"} 0.0',
        'nodevitals_delivery_latency_seconds_count{sink="webhook:receiver.example:8443"} 1.0',
        'nodevitals_delivery_last_success_timestamp_seconds{sink="webhook:receiver.example:8443"}',
    ):
        assert line in text
    for secret in ("pa55word", "user", "do-not-show", "/hooks", SECRET, SECRET.removeprefix("whsec_")):
        assert secret not in text and secret not in state
    assert signing.verify([signing.decode_secret(SECRET)], script.calls[0][2], b"") is False  # body matters


def test_two_endpoints_on_one_host_get_distinct_names() -> None:
    assert endpoint_names(["https://a.example/x", "https://a.example/y", "https://[::1]:9/z", "http://b:80/"]) == [
        "webhook:a.example",
        "webhook:a.example#1",
        "webhook:[::1]:9",
        "webhook:b:80",
    ]


async def test_events_arriving_during_a_commit_are_drained_on_shutdown(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while a commit is in flight, with more events waiting in the channel: they reach the spool too."""
    gate, in_commit = trio.Event(), trio.Event()

    async def call(self: Spool, fn: Callable[..., Any], *args: Any) -> Any:
        await trio.lowlevel.checkpoint()
        if fn is SpoolDB.add and not gate.is_set():
            in_commit.set()
            await gate.wait()  # a slow fsync
        return self.run(fn, *args)

    monkeypatch.setattr(Spool, "call", call)
    script = Script(lambda seq, n: None)
    async with (
        trio.open_nursery() as outer,
        running(tmp_path, hook(URL), transport=script.transport()) as (_sink, bus),
    ):
        bus.publish(event(0))
        await in_commit.wait()
        for i in range(1, 50):
            bus.publish(event(i))
        outer.start_soon(_release, gate)  # the commit finishes a second after the cancellation below
    assert [r.event_id for r in SpoolDB(tmp_path / FILE).rows()] == [event(i).id for i in range(50)]


async def _release(gate: trio.Event) -> None:
    await trio.sleep(1)
    gate.set()
