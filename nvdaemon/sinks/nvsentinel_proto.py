"""A HealthEvent in protobuf's binary wire format, written without the protobuf runtime.

The agent sends one message type (``datamodels.HealthEvents`` of protos/health_event.proto) and never reads one, so
this small proto3 encoder stands in for ``google.protobuf`` on the agent's NVSentinel path (the runtime costs about
3 MiB of resident memory, bench/rss.py). tests/nvsentinel/test_proto_encode.py checks that protobuf decodes what it
writes to the message protobuf itself would build. The field numbers are the .proto's (tests/nvsentinel/test_proto.py
holds them to NVSentinel's contract).

proto3 rules kept: a scalar field that holds its default (0, false, "") is left out; a repeated element and a
message field are written even when empty; map entries are (key = 1, value = 2) messages that hold both even when
empty (as protobuf writes them).
"""

from __future__ import annotations

from nvdaemon.sinks.nvsentinel_map import PROCESSING_STRATEGIES, RECOMMENDED_ACTIONS, HealthEventSpec

_VARINT, _LEN = 0, 2
_U64 = (1 << 64) - 1


def varint(n: int) -> bytes:
    """Base-128, least significant group first; a negative int64 as its 64-bit two's complement (10 bytes)."""
    n &= _U64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def _int(field: int, n: int) -> bytes:
    return _tag(field, _VARINT) + varint(n) if n else b""


def _len(field: int, data: bytes) -> bytes:
    return _tag(field, _LEN) + varint(len(data)) + data


def _str(field: int, s: str) -> bytes:
    return _len(field, s.encode("utf-8")) if s else b""


def timestamp(nanos: int) -> bytes:
    """google.protobuf.Timestamp (seconds = 1, nanos = 2) for nanoseconds since the epoch; nanos in [0, 1e9)."""
    seconds, rest = divmod(nanos, 1_000_000_000)
    return _int(1, seconds) + _int(2, rest)


def health_event(spec: HealthEventSpec, *, now: float, event_id: str) -> bytes:
    """One ``datamodels.HealthEvent`` (version 1) for ``spec``, stamped with ``now`` (seconds since the epoch) and
    ``event_id``."""
    parts = [
        _int(1, 1),  # version
        _str(2, spec.agent),
        _str(3, spec.component_class),
        _str(4, spec.check_name),
        _int(5, spec.is_fatal),
        _int(6, spec.is_healthy),
        _str(7, spec.message),
        _int(8, RECOMMENDED_ACTIONS[spec.recommended_action]),
        *(_len(9, code.encode("utf-8")) for code in spec.error_code),
        *(_len(10, _str(1, e.type) + _str(2, e.value)) for e in spec.entities),
        *(_len(11, _len(1, k.encode("utf-8")) + _len(2, v.encode("utf-8"))) for k, v in spec.metadata.items()),
        _len(12, timestamp(int(now * 1e9))),  # generatedTimestamp, always set
        _str(13, spec.node_name),
        # 14 quarantineOverrides, 15 drainOverrides: never set by the agent
        _int(16, PROCESSING_STRATEGIES[spec.processing_strategy]),
        _str(17, event_id),
        _str(18, spec.custom_recommended_action),
    ]
    return b"".join(parts)


def health_events(spec: HealthEventSpec, *, now: float, event_id: str) -> bytes:
    """The request of ``HealthEventOccurredV1``: ``datamodels.HealthEvents`` (version 1) holding one event."""
    return _int(1, 1) + _len(2, health_event(spec, now=now, event_id=event_id))
