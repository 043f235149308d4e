"""CloudEvents 1.0 envelopes for events, in the HTTP binding's structured or binary content mode. Pure: no I/O.

- structured (default): ``Content-Type: application/cloudevents+json``, the body is the whole envelope with the
  event under ``data``;
- binary: the attributes travel as ``ce-*`` headers (percent-encoded as the HTTP binding says), the body is the
  event itself as ``application/json``.

Attributes, as the Go agent sends them (nodevitals-contract.md §3): ``specversion`` 1.0, ``type``
``com.nodevitals.hw.event.v1``, ``source`` ``nodevitals/<node>``, ``id`` the event id (stable across retries, and the
``webhook-id``), ``time`` when the transition happened (``ended_at`` for an EXIT that has one, else ``started_at``),
``datacontenttype`` ``application/json``; no ``subject``. ``data`` is ``Event.wire()``. Every time is RFC 3339 in
UTC, as Go writes a time (``gotime.rfc3339``).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from nvdaemon.gotime import rfc3339
from nvdaemon.model import Event, Phase

SPECVERSION = "1.0"
TYPE = "com.nodevitals.hw.event.v1"
STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
JSON_CONTENT_TYPE = "application/json"
Mode = Literal["structured", "binary"]

# HTTP binding 1.0.2 §3.1.3.2: printable ASCII except space, double quote and percent travels as is.
_SAFE = frozenset(chr(c) for c in range(0x21, 0x7F)) - {'"', "%"}


def event_time(event: Event) -> float:
    if event.phase is Phase.EXIT and event.ended_at is not None:
        return event.ended_at
    return event.started_at


def attributes(event: Event) -> dict[str, str]:
    """The context attributes of the envelope, in a stable order."""
    return {
        "specversion": SPECVERSION,
        "type": TYPE,
        "source": f"nodevitals/{event.node}",
        "id": event.id,
        "time": rfc3339(event_time(event)),
        "datacontenttype": JSON_CONTENT_TYPE,
    }


def percent_encode(value: str) -> str:
    """Header value encoding of the HTTP binding: UTF-8, unsafe bytes as %XX."""
    out = []
    for ch in value:
        if ch in _SAFE:
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8"))
    return "".join(out)


def encode(event: Event, mode: Mode = "structured") -> tuple[dict[str, str], bytes]:
    """Headers and the exact body bytes of one delivery (the signature is computed over these bytes)."""
    attrs = attributes(event)
    if mode == "binary":
        headers = {"content-type": JSON_CONTENT_TYPE}
        headers |= {f"ce-{k}": percent_encode(v) for k, v in attrs.items() if k != "datacontenttype"}
        return headers, msgspec.json.encode(event.wire())
    envelope: dict[str, Any] = {**attrs, "data": event.wire()}
    return {"content-type": STRUCTURED_CONTENT_TYPE}, msgspec.json.encode(envelope)
