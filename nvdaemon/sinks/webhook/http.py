"""One webhook delivery as an HTTP exchange: the request for a spooled event and what its answer decides.

Sends one ``POST`` to the endpoint's URL: the event encoded by ``nvdaemon.sinks.cloudevent`` in the endpoint's mode
(binary or structured), the configured ``headers`` under the protocol's own, and the ``webhook-id``,
``webhook-timestamp`` (wall-clock seconds) and ``webhook-signature`` headers (one signature per configured key, none
for an unsigned endpoint: ``nvdaemon.sinks.webhook.signing``). Redirects are not followed. The whole exchange, status,
headers and body, is bounded by twice ``timeoutSeconds`` (httpx's own timeouts are per phase).

Of the answer only the status, and on a retry the ``Retry-After`` header, are used. Its body is read only so the
keep-alive connection can be reused: at most ``ANSWER_LIMIT`` (64 KiB) of it, as the bytes came over the wire, never
decompressed (a small compressed answer cannot inflate in memory), and thrown away. The client asks for
``Accept-Encoding: identity`` for the same reason. A longer, cut-off or late body is left unread and its connection
closed: the next request opens a fresh one.

Outcomes (``post_event``): ``success`` (2xx), ``gone`` (410), ``retryable`` (408, 429, 5xx; with the ``Retry-After``
delay, capped at an hour), ``rejected`` (any other status), ``timeout`` and ``connection_error``. What each one does to
the event (retry, dead letter, disabling the endpoint) is ``nvdaemon.sinks.webhook.endpoint``'s to decide.

Errors never carry the URL's credentials: a transport error's text has the URL redacted (``webhook_url.redact``).
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
from collections.abc import Callable

import httpx
import msgspec
import trio

from nvdaemon.config import WebhookSink
from nvdaemon.model import Event
from nvdaemon.sinks import cloudevent
from nvdaemon.sinks.webhook import signing
from nvdaemon.sinks.webhook import url as webhook_url
from nvdaemon.sinks.webhook.config import read_secret_file

# httpx logs every request with its full URL at INFO; a URL may carry credentials.
logging.getLogger("httpx").setLevel(logging.WARNING)
logging.getLogger("httpcore").setLevel(logging.WARNING)

RETRY_AFTER_CAP = 3600.0  # seconds: the longest ``Retry-After`` honoured
TRANSIENT = frozenset({408, 429})  # 4xx statuses retried like a 5xx
# Bytes of a receiver's answer body read (raw, never inflated) and thrown away: only the status and headers matter.
# Acks and proxies' error pages are well under this, so their connection stays reusable; a longer answer costs a new
# connection instead of memory (at most this plus one 64 KiB read is ever held).
ANSWER_LIMIT = 64 * 1024

Outcome = tuple[str, str | None, float | None]  # (outcome, error or None on success, Retry-After seconds or None)


def load_keys(hook: WebhookSink) -> list[str]:
    """The configured secrets, newest first; a secretFile holds one per line (``read_secret_file``: OSError or
    ValueError for the file)."""
    if hook.secret_file:
        return read_secret_file(hook.secret_file)
    return list(hook.secrets) if hook.secrets else [hook.secret] if hook.secret else []


def open_client(hook: WebhookSink, transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    """The endpoint's keep-alive client (enter it with ``async with``): ``timeoutSeconds`` per phase, no redirects,
    and ``Accept-Encoding: identity``: a receiver has no reason to compress an answer that is never read (and one that
    does anyway is not inflated, see ``drain_answer``)."""
    return httpx.AsyncClient(
        transport=transport,
        timeout=httpx.Timeout(hook.timeout_seconds),
        follow_redirects=False,
        headers={"Accept-Encoding": "identity"},
    )


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_CAP)
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return min(max(0.0, when - now), RETRY_AFTER_CAP)


async def post_event(
    client: httpx.AsyncClient, hook: WebhookSink, keys: list[bytes], wall: Callable[[], float], stored: bytes
) -> Outcome:
    """POST one spooled event (``stored``: its JSON as the spool holds it), signed with ``keys`` at ``wall()``
    seconds; ``(outcome, error, Retry-After seconds)``."""
    event = msgspec.json.decode(stored, type=Event)
    headers, body = cloudevent.encode(event, hook.mode)
    headers = {**hook.headers, **headers}
    headers |= signing.sign_headers(keys, event.id, int(wall()), body)
    timeout = hook.timeout_seconds
    deadline = trio.current_time() + timeout * 2  # httpx's timeouts are per phase; this bounds the whole exchange
    try:
        with trio.fail_at(deadline):
            request = client.build_request("POST", hook.url, content=body, headers=headers)
            resp = await client.send(request, stream=True)  # returns once the status and headers are in
    except (httpx.TimeoutException, trio.TooSlowError):
        return "timeout", f"no response within {timeout:g}s", None
    except httpx.TransportError as exc:
        text = webhook_url.redact(str(exc), hook.url)
        return "connection_error", f"{type(exc).__name__}: {text}" if text else type(exc).__name__, None
    try:
        with trio.move_on_at(deadline):
            await drain_answer(resp, ANSWER_LIMIT)
    finally:
        await resp.aclose()  # a connection whose answer was not read to its end is closed here, never reused
    code = resp.status_code
    error = f"HTTP {code}"
    if 200 <= code < 300:
        return "success", None, None
    if code == 410:
        return "gone", error, None
    if code in TRANSIENT or code >= 500:
        return "retryable", error, retry_after(resp.headers.get("retry-after"), wall())
    return "rejected", error, None


async def drain_answer(resp: httpx.Response, limit: int) -> int:
    """Read and throw away at most about ``limit`` bytes of an answer's body, as they came over the wire (a
    ``Content-Encoding`` is never undone, so a small compressed answer cannot inflate); returns the bytes read.

    The outcome is the status alone: a body that is longer than ``limit``, cut off or slower than the caller's
    deadline is left unread, and closing the response then closes its connection (httpcore puts a connection back
    into the pool only when its exchange completed), so the next request opens a fresh one."""
    read = 0
    if resp.is_stream_consumed:  # a body made in memory (an in-process transport): there is no wire to read
        return read
    with contextlib.suppress(httpx.TransportError):  # the status is in; a broken body changes nothing
        async for chunk in resp.aiter_raw():
            read += len(chunk)
            if read > limit:
                break
    return read
