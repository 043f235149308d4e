"""Shared pieces of the webhook tests: config structs, events, a running sink."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import trio

from nvdaemon.bus import EventBus
from nvdaemon.config import SpoolConfig, WebhookSink
from nvdaemon.model import Event, Phase
from nvdaemon.sinks.webhook import WebhookEndpoint

SECRET = "whsec_" + base64.b64encode(b"nvdaemon-test-key-0123456789abcdef").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"nvdaemon-old-key-0123456789abcdef!").decode()


def hook(url: str, **fields: Any) -> WebhookSink:
    raw = {"url": url, "secret": SECRET, "backoffBaseSeconds": 0.05, "backoffMaxSeconds": 0.2, **fields}
    return msgspec.convert({k: v for k, v in raw.items() if v is not None}, WebhookSink)


def event(i: int, severity: str = "warning", node: str = "node-1") -> Event:
    return Event(
        id=f"00000000-0000-7000-8000-{i:012d}",
        node=node,
        tier="core",
        device="cpu",
        condition="load_high",
        phase=Phase.ENTER,
        severity=severity,
        seq=i,
        started_at=time.time(),
        detail={"value": float(i), "threshold": 1.0, "metric": "load1", "labels": {}},
    )


@asynccontextmanager
async def running(
    state_dir: Path,
    h: WebhookSink,
    *,
    name: str = "webhook:test",
    spool: SpoolConfig | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    wall: Callable[[], float] = time.time,
    jitter: Callable[[], float] = lambda: 1.0,
) -> AsyncIterator[tuple[WebhookEndpoint, EventBus]]:
    bus = EventBus()
    sink = WebhookEndpoint(name, h, spool or SpoolConfig(), state_dir, transport=transport, wall=wall, jitter=jitter)
    sink.attach(bus)
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.serve)
        yield sink, bus
        nursery.cancel_scope.cancel()


async def until(predicate: Callable[[], bool], timeout: float = 15.0, step: float = 0.01) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(step)
