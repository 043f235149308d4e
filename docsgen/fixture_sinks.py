"""The fixture agent's delivering sinks, served until every family a sink exposes has a series.

A family counted by outcome, reason or code (``nodevitals_delivery_attempts_total``,
``nodevitals_webhook_dropped_total``, ``nodevitals_webhook_spool_quarantines_total``,
``nvsentinel_health_events_publisher_sends_error_total``) has no series before its first count, and the time of
the last 2xx is not exposed at all before one; the page takes a family's labels from its series. So the webhook
endpoints and the NVSentinel sink run their own tasks (``serve``) on the events the fixture rule raised, against
stand-ins inside this process, until each has counted something:

- the receivers are an ``httpx.MockTransport``: ``ACCEPTS`` answers 204 (an attempt, the time of the last 2xx),
  ``REJECTS`` answers 400, which with ``maxAttempts: 1`` makes the event a dead letter (an attempt, a drop);
- the spool they start from (``stateDir/spool.db``) is garbage, which the first spool call moves aside and counts;
- the platform-connector socket is a bound Unix socket and the token file is absent, so each send fails with
  ``TOKEN_ERROR`` before any call is made.

Nothing leaves the process. Served until no family of any sink lacks a series and every endpoint got an answer,
within ``DEADLINE_SECONDS``; past it the generator stops, naming the families still without one.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import trio

from nvdaemon.app import Agent
from nvdaemon.server.self_metrics import sink_metrics
from nvdaemon.sinks.base import Sink
from nvdaemon.sinks.nvsentinel.sink import NvsentinelHealthSink
from nvdaemon.sinks.webhook.endpoint import WebhookEndpoint
from nvdaemon.sinks.webhook.spool import FILE

ACCEPTS = "hooks.example.com"
REJECTS = "rejects.example.com"
WEBHOOKS = (
    f'{{url: "https://{ACCEPTS}/events", secret: example}}, '
    f'{{url: "https://{REJECTS}/events", secret: example, maxAttempts: 1}}'
)
SOCKET = "platform-connector.sock"  # under the fixture agent's temporary directory
TOKEN = "token-absent"
DEADLINE_SECONDS = 30.0
POLL_SECONDS = 0.01


def _receiver(request: httpx.Request) -> httpx.Response:
    return httpx.Response(204 if request.url.host == ACCEPTS else 400)


@contextlib.contextmanager
def stand_ins(tmp: Path, state_dir: Path) -> Iterator[None]:
    """A garbage spool file in ``state_dir``, and a Unix socket at ``tmp/SOCKET`` while the sinks run (present, so
    a send goes as far as reading the token)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / FILE).write_bytes(b"not a spool\n" * 512)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(tmp / SOCKET))
        yield


def without_series(agent: Agent) -> list[str]:
    """The sinks' families, as ``/metrics`` has them (one per name), that have no series yet."""
    return [fam.name for fam in sink_metrics(agent) if not fam.samples]


async def _until(done: Callable[[], bool], agent: Agent) -> None:
    try:
        with trio.fail_after(DEADLINE_SECONDS):
            # A poll: the counts change in the sinks' own tasks, which signal nothing this module could wait on.
            while not done():  # noqa: ASYNC110
                await trio.sleep(POLL_SECONDS)
    except trio.TooSlowError:
        raise RuntimeError(
            f"the fixture agent's sinks counted nothing for these families in {DEADLINE_SECONDS:g} s: "
            f"{', '.join(without_series(agent)) or '(every endpoint to get an answer)'}"
        ) from None


async def serve_sinks(agent: Agent) -> None:
    """Serve the webhook endpoints and the NVSentinel sink (module docstring; inside ``stand_ins``), then stop
    them."""
    endpoints = [s for s in agent.sinks.values() if isinstance(s, WebhookEndpoint)]
    served: list[Sink] = [*endpoints, *(s for s in agent.sinks.values() if isinstance(s, NvsentinelHealthSink))]
    for ep in endpoints:
        ep.transport = httpx.MockTransport(_receiver)
    async with trio.open_nursery() as nursery:
        for sink in served:
            await nursery.start(sink.serve)
        await _until(lambda: not without_series(agent) and all(ep.attempts for ep in endpoints), agent)
        nursery.cancel_scope.cancel()
