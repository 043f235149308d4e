"""Fan-out of events to subscribers (webhook senders, NVSentinel, the websocket hub, the event log).

Each subscriber gets its own bounded channel. ``publish`` never waits: a subscriber whose channel is full loses the
event and the loss is counted per subscriber, so one slow sink can never delay the engine or the others. Sinks that
must not lose events (the webhook) keep their channel drained into a durable spool.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import trio

from nvdaemon.model import Event

RECENT_EVENTS = 100


@dataclass
class Subscription:
    name: str
    send: trio.MemorySendChannel[Event]
    receive: trio.MemoryReceiveChannel[Event]
    delivered: int = 0


@dataclass
class EventBus:
    """Publish events to every subscriber without waiting; keep the most recent ones for ``/v1/status``."""

    recent: collections.deque[Event] = field(default_factory=lambda: collections.deque(maxlen=RECENT_EVENTS))
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    published: int = 0
    last_seq: int = 0  # highest event seq published
    drop_totals: dict[str, int] = field(default_factory=dict)  # survives unsubscribe: a counter never goes back

    def subscribe(self, name: str, capacity: int = 1024) -> trio.MemoryReceiveChannel[Event]:
        """Open a channel named ``name``; a second subscription under the same name replaces the first."""
        old = self.subscriptions.pop(name, None)
        if old is not None:
            old.send.close()
        send, receive = trio.open_memory_channel[Event](capacity)
        self.subscriptions[name] = Subscription(name, send, receive)
        self.drop_totals.setdefault(name, 0)
        return receive

    def unsubscribe(self, name: str) -> None:
        sub = self.subscriptions.pop(name, None)
        if sub is not None:
            sub.send.close()

    def publish(self, event: Event) -> None:
        self.published += 1
        self.last_seq = max(self.last_seq, event.seq)
        self.recent.append(event)
        for sub in list(self.subscriptions.values()):
            try:
                sub.send.send_nowait(event)
                sub.delivered += 1
            except trio.WouldBlock:
                self.drop_totals[sub.name] = self.drop_totals.get(sub.name, 0) + 1
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                # The subscriber went away without unsubscribing; forget it rather than count forever.
                self.subscriptions.pop(sub.name, None)
