"""CloudEvents envelopes, parsed back with the ``cloudevents`` SDK in both content modes."""

from __future__ import annotations

import datetime as dt
import json
import re

import msgspec
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.model import Event, Phase
from nvdaemon.sinks import cloudevent

STRUCTURED = "application/cloudevents+json"

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


# What Go's time.Parse(time.RFC3339, ...) accepts (it is what time.Time's UnmarshalJSON calls): a fraction of up to
# nine digits, then Z or an offset.
GO_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
ENTER_DATA = {
    "id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
    "node": "gpu-node-7",
    "tier": "core",
    "device": "0000:3b:00.0",
    "condition": "pcie_aer_fatal",
    "phase": "ENTER",
    "severity": "critical",
    "seq": 42,
    "started_at": "2024-12-02T11:48:43.456Z",
    "detail": {"value": 3.0, "threshold": 0.0, "metric": "pcie_aer_fatal_total", "labels": {}},
}
EXIT_DATA = {
    **{k: v for k, v in ENTER_DATA.items() if k != "detail"},
    "id": "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c",
    "phase": "EXIT",
    "ended_at": "2024-12-02T11:50:00Z",
    "detail": ENTER_DATA["detail"],
}


@pytest.mark.parametrize("mode", ["structured", "binary"])
@pytest.mark.parametrize(
    ("event", "time", "expected"),
    [(ENTER, "2024-12-02T11:48:43.456Z", ENTER_DATA), (EXIT, "2024-12-02T11:50:00Z", EXIT_DATA)],
)
def test_envelope_parses_with_the_sdk(
    mode: cloudevent.Mode, event: Event, time: str, expected: dict[str, object]
) -> None:
    headers, body = cloudevent.encode(event, mode)
    ce = from_http_event(HTTPMessage(headers=headers, body=body))
    assert ce.get_attributes() == {
        "specversion": "1.0",
        "type": "com.nodevitals.hw.event.v1",
        "source": "nodevitals/gpu-node-7",
        "id": event.id,
        "time": dt.datetime.fromisoformat(time),
        "datacontenttype": "application/json",
    }
    assert ce.get_subject() is None  # the Go agent sends none
    data = ce.get_data()
    data = json.loads(data) if isinstance(data, bytes | str) else data
    assert data == expected
    assert list(data) == list(expected)  # the Go field order
    if mode == "structured":
        assert headers == {"content-type": "application/cloudevents+json"}
        assert json.loads(body)["time"] == time
        assert "subject" not in json.loads(body)
    else:
        assert headers["content-type"] == "application/json"
        assert headers["ce-id"] == event.id and headers["ce-time"] == time
        assert not [h for h in headers if h == "ce-subject"]
        assert json.loads(body) == expected


def test_enter_has_no_ended_at_and_exit_carries_the_enter_start() -> None:
    enter = json.loads(cloudevent.encode(ENTER)[1])["data"]
    exit_ = json.loads(cloudevent.encode(EXIT)[1])["data"]
    assert "ended_at" not in enter  # absent, not null
    assert exit_["started_at"] == enter["started_at"]
    assert dt.datetime.fromisoformat(exit_["ended_at"]) > dt.datetime.fromisoformat(exit_["started_at"])
    # An ENTER never carries ended_at, even a malformed one that has it set.
    odd = msgspec.structs.replace(ENTER, ended_at=1733140200.0)
    assert "ended_at" not in odd.wire()


@given(st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False))
def test_times_are_rfc3339_as_go_reads_them(ts: float) -> None:
    """Any time we keep comes out in the grammar Go's time.Time unmarshals, UTC, within a microsecond."""
    event = msgspec.structs.replace(EXIT, started_at=ts, ended_at=ts)
    envelope = json.loads(cloudevent.encode(event)[1])
    for text in (envelope["time"], envelope["data"]["started_at"], envelope["data"]["ended_at"]):
        assert GO_RFC3339.match(text) and text.endswith("Z")
        assert abs(dt.datetime.fromisoformat(text).timestamp() - ts) <= 1e-6
    assert from_http_event(HTTPMessage(headers={"content-type": STRUCTURED}, body=json.dumps(envelope).encode()))


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
    assert ce.get_source() == f"nodevitals/{node}"
    data = ce.get_data()
    parsed = json.loads(data) if isinstance(data, bytes | str) else data
    assert isinstance(parsed, dict) and (parsed["device"], parsed["node"]) == (device, node)
