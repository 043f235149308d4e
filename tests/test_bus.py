"""The event bus: fan-out to every subscriber, never blocking on a slow one, drops counted per subscriber."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from nvdaemon.bus import RECENT_EVENTS, EventBus
from nvdaemon.model import Event, Phase


def event(seq: int) -> Event:
    return Event(
        id=f"id-{seq}",
        node="n",
        tier="core",
        device="d",
        condition="c",
        phase=Phase.ENTER if seq % 2 else Phase.EXIT,
        severity="warning",
        seq=seq,
        started_at=float(seq),
    )


def drain(receive: trio.MemoryReceiveChannel[Event]) -> list[int]:
    out: list[int] = []
    while True:
        try:
            out.append(receive.receive_nowait().seq)
        except trio.WouldBlock:
            return out


async def test_every_subscriber_gets_every_event_in_order() -> None:
    bus = EventBus()
    receivers = {name: bus.subscribe(name) for name in ("webhook", "hub", "log")}
    got: dict[str, list[int]] = {}

    async def consume(name: str, receive: trio.MemoryReceiveChannel[Event]) -> None:
        got[name] = [ev.seq async for ev in receive]

    async with trio.open_nursery() as nursery:
        for name, receive in receivers.items():
            nursery.start_soon(consume, name, receive)
        for seq in range(1, 51):
            bus.publish(event(seq))
            await trio.sleep(0)
        for name in list(receivers):
            bus.unsubscribe(name)  # closes the send side: the consumers' loops end
    assert got == {name: list(range(1, 51)) for name in receivers}
    assert bus.published == 50
    assert all(sub == 0 for sub in bus.drop_totals.values())


async def test_full_subscriber_drops_and_counts_without_blocking_others() -> None:
    bus = EventBus()
    slow = bus.subscribe("slow", capacity=2)
    fast = bus.subscribe("fast", capacity=100)
    with trio.testing.assert_no_checkpoints():  # publish never waits
        for seq in range(1, 11):
            bus.publish(event(seq))
    assert bus.drop_totals == {"slow": 8, "fast": 0}
    assert drain(slow) == [1, 2]  # the oldest kept, the overflow dropped
    assert drain(fast) == list(range(1, 11))
    assert bus.subscriptions["slow"].delivered == 2
    assert bus.subscriptions["fast"].delivered == 10
    # room again: delivery resumes, the count stays
    bus.publish(event(11))
    assert drain(slow) == [11]
    assert bus.drop_totals["slow"] == 8


async def test_zero_capacity_subscriber_without_a_waiting_reader_drops() -> None:
    bus = EventBus()
    bus.subscribe("unbuffered", capacity=0)
    other = bus.subscribe("other")
    bus.publish(event(1))
    assert bus.drop_totals["unbuffered"] == 1
    assert drain(other) == [1]


async def test_drop_totals_stay_monotonic_across_unsubscribe_and_resubscribe() -> None:
    bus = EventBus()
    bus.subscribe("ws", capacity=1)
    for seq in range(1, 5):
        bus.publish(event(seq))
    assert bus.drop_totals["ws"] == 3
    bus.unsubscribe("ws")
    assert "ws" not in bus.subscriptions
    assert bus.drop_totals["ws"] == 3
    bus.publish(event(5))
    assert bus.drop_totals["ws"] == 3  # not subscribed: nothing to drop
    again = bus.subscribe("ws", capacity=1)
    assert bus.drop_totals["ws"] == 3
    bus.publish(event(6))
    bus.publish(event(7))
    assert bus.drop_totals["ws"] == 4
    assert drain(again) == [6]


async def test_resubscribing_replaces_and_closes_the_old_channel() -> None:
    bus = EventBus()
    old = bus.subscribe("hub")
    new = bus.subscribe("hub")
    bus.publish(event(1))
    assert drain(new) == [1]
    with pytest.raises(trio.EndOfChannel):  # closed: a reader ends instead of waiting forever
        old.receive_nowait()


async def test_unsubscribe_unknown_name_is_harmless() -> None:
    bus = EventBus()
    bus.unsubscribe("never")
    bus.publish(event(1))
    assert bus.published == 1


async def test_subscriber_that_closed_its_channel_is_forgotten() -> None:
    bus = EventBus()
    gone = bus.subscribe("gone")
    kept = bus.subscribe("kept")
    gone.close()
    bus.publish(event(1))
    bus.publish(event(2))
    assert "gone" not in bus.subscriptions
    assert bus.drop_totals.get("gone", 0) == 0
    assert drain(kept) == [1, 2]


async def test_recent_keeps_the_last_n() -> None:
    bus = EventBus()
    for seq in range(1, RECENT_EVENTS + 51):
        bus.publish(event(seq))
    assert len(bus.recent) == RECENT_EVENTS
    assert [ev.seq for ev in bus.recent] == list(range(51, RECENT_EVENTS + 51))
    assert bus.published == RECENT_EVENTS + 50


async def test_recent_is_kept_without_subscribers() -> None:
    bus = EventBus()
    bus.publish(event(1))
    bus.publish(event(2))
    assert [ev.seq for ev in bus.recent] == [1, 2]
