"""Delivery to a real HTTP receiver on loopback (tests/sinks/receiver.py): every request is verified with the
``standardwebhooks`` library and parsed with the ``cloudevents`` SDK. Real time, small backoffs."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest
import trio

from nvdaemon.bus import EventBus
from nvdaemon.config import SpoolConfig
from nvdaemon.sinks.webhook import endpoint as webhook
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.spool import SpoolDB
from nvdaemon.sinks.webhook.url import endpoint_names
from nvdaemon.supervise import Supervisor

from .helpers import OLD_SECRET, SECRET, event, hook, running, until
from .receiver import Receiver


async def test_structured_delivery_is_signed_parsed_and_kept_alive(tmp_path: Path) -> None:
    with Receiver(secret=SECRET) as rx:
        h = hook(rx.url, headers={"X-Tenant": "t1"})
        async with running(tmp_path, h) as (sink, bus):
            sent = [event(i) for i in range(5)]
            for ev in sent:
                bus.publish(ev)
            await until(lambda: sink.attempts.get("success") == 5)
            assert sink.backlog == 0 and sink.attempts == {"success": 5}
    assert all(r.verified for r in rx.received)
    assert rx.ids() == [ev.id for ev in sent]
    for r, ev in zip(rx.received, sent, strict=True):
        assert r.headers["content-type"] == "application/cloudevents+json"
        assert r.headers["webhook-id"] == ev.id == r.attributes["id"]
        assert r.headers["x-tenant"] == "t1"
        assert r.attributes["type"] == "com.nodevitals.hw.event.v1"
        assert r.attributes["source"] == "nodevitals/node-1"
        assert "subject" not in r.attributes
        assert r.data["seq"] == ev.seq and r.data["phase"] == "ENTER"
    assert len({r.client_port for r in rx.received}) == 1  # one keep-alive connection


async def test_binary_mode(tmp_path: Path) -> None:
    with Receiver(secret=SECRET) as rx:
        async with running(tmp_path, hook(rx.url, mode="binary")) as (_sink, bus):
            bus.publish(event(1))
            await until(lambda: len(rx.received) == 1)
    (r,) = rx.received
    assert r.verified and r.event_id == event(1).id
    assert r.headers["ce-specversion"] == "1.0" and r.headers["content-type"] == "application/json"
    assert r.data["id"] == event(1).id


async def test_receiver_down_then_up_every_event_arrives_in_order(tmp_path: Path) -> None:
    rx = Receiver(secret=SECRET)  # port reserved, nothing listening yet
    async with running(tmp_path, hook(rx.url)) as (sink, bus):
        for i in range(10):
            bus.publish(event(i))
        await until(lambda: sink.attempts.get("connection_error", 0) >= 3)
        assert sink.backlog == 10 and sink.state()["lastError"].startswith("ConnectError")
        # Up again; the answer to event 3 is lost on the way back (the receiver got it, the agent never learns).
        rx.script = [200, 200, 200, "drop"]
        rx.start()
        try:
            for i in range(10, 20):
                bus.publish(event(i))
            await until(lambda: sink.backlog == 0 and len(set(rx.ids())) == 20)
        finally:
            rx.stop()
    seqs = rx.seqs()
    assert list(dict.fromkeys(seqs)) == list(range(20))  # every event, first arrivals in order
    assert seqs == sorted(seqs)  # nothing ever overtook
    assert [s for s in set(seqs) if seqs.count(s) > 1] == [3]  # a duplicate only where a 2xx was lost
    assert all(r.verified for r in rx.received)


async def test_receiver_that_never_answers_times_out_then_delivers(tmp_path: Path) -> None:
    with Receiver(secret=SECRET) as rx:
        rx.script = ["hang"]
        async with running(tmp_path, hook(rx.url, timeoutSeconds=0.5)) as (sink, bus):
            bus.publish(event(1))
            await until(lambda: sink.backlog == 0 and sink.attempts.get("success") == 1)
            assert sink.attempts["timeout"] == 1
    assert rx.ids() == [event(1).id, event(1).id]
    assert rx.received[1].at - rx.received[0].at >= 0.5


async def test_500_503_retry_after_and_429_are_retried(tmp_path: Path) -> None:
    with Receiver(secret=SECRET) as rx:
        rx.script = [500, (503, {"Retry-After": "3"}), 429, 200]
        async with running(tmp_path, hook(rx.url)) as (sink, bus):
            bus.publish(event(1))
            await until(lambda: sink.attempts.get("success") == 1)
            assert sink.attempts == {"retryable": 3, "success": 1}
    at = [r.at for r in rx.received]
    assert at[2] - at[1] >= 2.95  # Retry-After: 3 honoured (backoff alone is at most 0.2 s here)
    # The other retries wait the backoff only: well under 3 s, with room for a loaded machine.
    assert at[1] - at[0] < 2 and at[3] - at[2] < 2


async def test_410_disables_and_400_dead_letters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The disabled sender looks again every IDLE_POLL; counting its looks shows it came round and still sent nothing.
    monkeypatch.setattr(webhook, "IDLE_POLL", 0.01)
    looks: list[str] = []
    real_disabled = SpoolDB.disabled

    def disabled(db: SpoolDB, name: str, url_hash: str) -> str | None:
        looks.append(name)
        return real_disabled(db, name, url_hash)

    monkeypatch.setattr(SpoolDB, "disabled", disabled)
    with Receiver(secret=SECRET) as rx:
        rx.script = [400, 400, 400, 200, 410]
        async with running(tmp_path, hook(rx.url, maxAttempts=3)) as (sink, bus):
            for i in range(4):
                bus.publish(event(i))
            await until(lambda: sink.state()["state"] == "disabled")
            seen = len(looks)
            await until(lambda: len(looks) >= seen + 3, "the disabled sender's next three looks at the spool")
            state = sink.state()
    assert [r.answered for r in rx.received] == [400, 400, 400, 200, 410]
    assert rx.seqs() == [0, 0, 0, 1, 2]
    assert state["deadLetters"] == 1 and state["backlog"] == 2 and state["lastError"] == "HTTP 410"
    assert state["dropped"] == {"rejected": 1}


async def test_secret_rotation_old_and_new_key_receivers_both_verify(tmp_path: Path) -> None:
    stranger = "whsec_" + base64.b64encode(b"a-key-nobody-configured-at-all!!").decode()
    with Receiver(secret=OLD_SECRET) as old, Receiver(secret=SECRET) as new, Receiver(secret=stranger) as other:
        urls = [old.url.replace("127.0.0.1", "localhost"), new.url, other.url]
        names = endpoint_names(urls)
        async with (
            running(tmp_path, hook(urls[0], secret=None, secrets=[SECRET, OLD_SECRET]), name=names[0]) as (_a, bus_a),
            running(tmp_path, hook(urls[1], secret=None, secrets=[SECRET, OLD_SECRET]), name=names[1]) as (_b, bus_b),
            running(tmp_path, hook(urls[2], secret=None, secrets=[SECRET, OLD_SECRET]), name=names[2]) as (c, bus_c),
        ):
            for bus in (bus_a, bus_b, bus_c):
                bus.publish(event(1))
            await until(lambda: len(old.received) == 1 and len(new.received) == 1 and c.dead_letters == 1)
    assert old.received[0].verified and new.received[0].verified
    assert len(new.received[0].headers["webhook-signature"].split(" ")) == 2
    assert [r.verified for r in other.received] == [False, False, False]  # verification is real: 401, dead letter


async def test_no_secret_or_url_credentials_in_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    raw = "raw-secret-not-for-logs"  # shorter than 24 bytes: draws a warning, which must not show it
    secret_file = tmp_path / "secret"
    secret_file.write_text(raw + "\n" + SECRET + "\n")
    rx = Receiver(secret=SECRET)
    url = rx.url.replace("http://", "http://alice:hunter2hunter2@")
    async with running(tmp_path, hook(url, secret=None, secretFile=str(secret_file))) as (sink, bus):
        bus.publish(event(1))
        await until(lambda: sink.attempts.get("connection_error", 0) >= 1)
        rx.script = [500, 400]  # then 200
        rx.start()
        try:
            bus.publish(event(2))
            await until(lambda: sink.attempts.get("success") == 2)
            assert sink.attempts == {"connection_error": 1, "retryable": 1, "rejected": 1, "success": 2}
        finally:
            rx.stop()
        shown = caplog.text + repr(sink.state()) + repr(list(sink.metrics()))
    assert "secret is shorter" in caplog.text and "delivery failing" in caplog.text
    assert all(r.verified for r in rx.received)
    for secret in (raw, SECRET, SECRET.removeprefix("whsec_"), "hunter2", "do-not-show", "/hooks/hw"):
        assert secret not in shown


async def test_unreachable_endpoint_backs_off_without_a_crash_loop(tmp_path: Path) -> None:
    """Connection refused is an outcome the sender handles, not an exception that restarts its task."""
    rx = Receiver()  # never started
    bus = EventBus()
    endpoint = WebhookEndpoint("webhook:down", hook(rx.url), SpoolConfig(), tmp_path)
    endpoint.attach(bus)
    async with trio.open_nursery() as nursery:
        sup = Supervisor(nursery)
        await sup.start(endpoint.name, endpoint.serve)
        bus.publish(event(1))
        await until(lambda: endpoint.attempts.get("connection_error", 0) >= 3)
        task = sup.tasks[endpoint.name]
        assert (task.state, task.restarts, task.last_error) == ("running", 0, None)
        assert endpoint.state()["lastError"].startswith("ConnectError") and endpoint.backlog == 1
        nursery.cancel_scope.cancel()
