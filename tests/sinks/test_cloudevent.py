"""CloudEvents envelopes, parsed back with the ``cloudevents`` SDK in both content modes."""

from __future__ import annotations

import datetime as dt
import json

import msgspec
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.model import Event, Phase
from nvdaemon.sinks import cloudevent

ENTER = Event(
    id="0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    node="gpu-node-7",
    tier="core",
    device="0000:3b:00.0",
    condition="pcie_aer_fatal",
    phase=Phase.ENTER,
    severity="critical",
    seq=42,
    started_at=1733140123.456,
    detail={"value": 3.0, "threshold": 0.0, "metric": "pcie_aer_fatal_total", "labels": {}},
)
EXIT = msgspec.structs.replace(
    ENTER, id="0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c", phase=Phase.EXIT, ended_at=1733140200.0
)


@pytest.mark.parametrize("mode", ["structured", "binary"])
@pytest.mark.parametrize(("event", "time"), [(ENTER, "2024-12-02T11:48:43.456Z"), (EXIT, "2024-12-02T11:50:00.000Z")])
def test_envelope_parses_with_the_sdk(mode: cloudevent.Mode, event: Event, time: str) -> None:
    headers, body = cloudevent.encode(event, mode)
    ce = from_http_event(HTTPMessage(headers=headers, body=body))
    assert ce.get_specversion() == "1.0"
    assert ce.get_type() == "com.nodevitals.hw.event.v1"
    assert ce.get_source() == "nodevitals/gpu-node-7"
    assert ce.get_id() == event.id
    assert ce.get_subject() == "0000:3b:00.0/pcie_aer_fatal"
    assert ce.get_datacontenttype() == "application/json"
    assert ce.get_time() == dt.datetime.fromisoformat(time)
    data = ce.get_data()
    data = json.loads(data) if isinstance(data, bytes | str) else data
    assert data == msgspec.to_builtins(event)
    if mode == "structured":
        assert headers["content-type"] == "application/cloudevents+json"
        assert json.loads(body)["time"] == time
    else:
        assert headers["content-type"] == "application/json"
        assert headers["ce-id"] == event.id and headers["ce-time"] == time
        assert json.loads(body) == msgspec.to_builtins(event)


def test_encoding_is_deterministic() -> None:
    """The same stored event gives the same bytes on every retry."""
    assert cloudevent.encode(ENTER) == cloudevent.encode(ENTER)


@given(
    device=st.text(min_size=1, max_size=30),
    node=st.text(min_size=1, max_size=30),
)
def test_binary_headers_survive_any_text(device: str, node: str) -> None:
    event = msgspec.structs.replace(ENTER, device=device, node=node)
    headers, body = cloudevent.encode(event, "binary")
    assert all(v.isascii() and " " not in v for v in headers.values())
    ce = from_http_event(HTTPMessage(headers=headers, body=body))
    assert ce.get_subject() == f"{device}/pcie_aer_fatal"
    assert ce.get_source() == f"nodevitals/{node}"
