"""Shared pieces of the webhook tests: config structs, events, a running sink."""

from __future__ import annotations

import base64
import errno
import functools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import msgspec
import trio

from nvdaemon.bus import EventBus
from nvdaemon.config import SpoolConfig, WebhookSink
from nvdaemon.model import Event, Phase
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.spool import SpoolDB
from tests import polling

T = TypeVar("T")

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
    **more: Any,
) -> AsyncIterator[tuple[WebhookEndpoint, EventBus]]:
    bus = EventBus()
    sink = WebhookEndpoint(
        name, h, spool or SpoolConfig(), state_dir, transport=transport, wall=wall, jitter=jitter, **more
    )
    sink.attach(bus)
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.serve)
        yield sink, bus
        nursery.cancel_scope.cancel()


until = functools.partial(polling.until, timeout=15.0, step=0.01)


class Faults:
    """Write errors injected where the spool writes: every write transaction (``SpoolDB._tx``) raises ``error``
    while it is set, and opening the file raises ``open_error`` while that is set."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.open_error: BaseException | None = None
        self.once: BaseException | None = None  # raised by the next write only

    def opener(self, path: Path) -> SpoolDB:
        if self.open_error is not None:
            raise self.open_error
        faults = self

        class Flaky(SpoolDB):
            def _tx(self, sync: str, fn: Callable[[], T]) -> T:
                if faults.once is not None:
                    exc, faults.once = faults.once, None
                    raise exc
                if faults.error is not None:
                    raise faults.error
                return super()._tx(sync, fn)

        return Flaky(path)


def disk_full() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("database or disk is full")
    exc.sqlite_errorcode = 13  # SQLITE_FULL, as sqlite sets it
    return exc


def malformed() -> sqlite3.DatabaseError:
    exc = sqlite3.DatabaseError("database disk image is malformed")
    exc.sqlite_errorcode = 11  # SQLITE_CORRUPT
    return exc


def io_error() -> OSError:
    return OSError(errno.EIO, os.strerror(errno.EIO))


def read_only() -> sqlite3.OperationalError:
    exc = sqlite3.OperationalError("attempt to write a readonly database")
    exc.sqlite_errorcode = 8  # SQLITE_READONLY
    return exc


class Script:
    """A receiver inside httpx: records (virtual time, event seq, headers); answers what ``answer`` says."""

    def __init__(self, answer: Callable[[int, int], httpx.Response | None]) -> None:
        self.answer = answer  # (seq, nth attempt of this seq) -> response, or None to hang
        self.calls: list[tuple[float, int, dict[str, str]]] = []
        self.delivered: list[int] = []

    def transport(self) -> httpx.MockTransport:
        async def handle(request: httpx.Request) -> httpx.Response:
            seq = int(request.headers["webhook-id"].rsplit("-", 1)[1])
            self.calls.append((trio.current_time(), seq, dict(request.headers)))
            resp = self.answer(seq, sum(1 for c in self.calls if c[1] == seq))
            if resp is None:
                await trio.sleep_forever()
            assert resp is not None
            if resp.is_success:
                self.delivered.append(seq)
            return resp

        return httpx.MockTransport(handle)

    def times(self, seq: int) -> list[float]:
        return [t for t, s, _ in self.calls if s == seq]
