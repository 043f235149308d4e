"""The hand-written HealthEvents encoder (nvdaemon/sinks/nvsentinel_proto.py) against protobuf itself: protobuf
decodes our bytes to the very message it builds from the same event (the builder below is how the agent made its
request with protobuf before), for any event hypothesis can make."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.sinks.nvsentinel_map import PROCESSING_STRATEGIES, RECOMMENDED_ACTIONS, Entity, HealthEventSpec
from nvdaemon.sinks.nvsentinel_proto import health_events, varint
from nvdaemon.sinks.nvsentinel_wire import to_proto


def with_protobuf(spec: HealthEventSpec, *, now: float, event_id: str) -> pb.HealthEvents:
    event = pb.HealthEvent(
        version=1,
        agent=spec.agent,
        componentClass=spec.component_class,
        checkName=spec.check_name,
        isFatal=spec.is_fatal,
        isHealthy=spec.is_healthy,
        message=spec.message,
        recommendedAction=RECOMMENDED_ACTIONS[spec.recommended_action],  # type: ignore[arg-type]
        errorCode=list(spec.error_code),
        entitiesImpacted=[pb.Entity(entityType=e.type, entityValue=e.value) for e in spec.entities],
        metadata=dict(spec.metadata),
        nodeName=spec.node_name,
        processingStrategy=PROCESSING_STRATEGIES[spec.processing_strategy],  # type: ignore[arg-type]
        id=event_id,
        customRecommendedAction=spec.custom_recommended_action,
    )
    event.generatedTimestamp.FromNanoseconds(int(now * 1e9))
    return pb.HealthEvents(version=1, events=[event])


text = st.text(max_size=40)
specs = st.builds(
    HealthEventSpec,
    agent=text,
    node_name=text,
    check_name=text,
    component_class=text,
    is_fatal=st.booleans(),
    is_healthy=st.booleans(),
    message=st.text(max_size=300),
    recommended_action=st.sampled_from(sorted(RECOMMENDED_ACTIONS)),
    error_code=st.lists(text, max_size=4).map(tuple),
    entities=st.lists(st.builds(Entity, type=text, value=text), max_size=4).map(tuple),
    processing_strategy=st.sampled_from(sorted(PROCESSING_STRATEGIES)),
    custom_recommended_action=text,
    metadata=st.dictionaries(text, text, max_size=4),
)
# Seconds since the epoch: 0 (every timestamp field left out), now-ish with nanoseconds, and far-out values.
instants = st.one_of(st.just(0.0), st.floats(min_value=0, max_value=4e9, allow_nan=False), st.integers(0, 2**33))


@settings(max_examples=300, deadline=None)
@given(spec=specs, now=instants, event_id=text)
def test_protobuf_decodes_our_bytes_to_its_own_message(spec: HealthEventSpec, now: float, event_id: str) -> None:
    ours = to_proto(spec, now=now, event_id=event_id)
    assert ours == health_events(spec, now=now, event_id=event_id)
    expected = with_protobuf(spec, now=now, event_id=event_id)
    decoded = pb.HealthEvents.FromString(ours)
    assert decoded == expected
    assert decoded.events[0].HasField("generatedTimestamp")
    # Nothing written twice or left over that decoding would merge or drop: protobuf's own bytes are as long.
    assert len(ours) == len(expected.SerializeToString())


def test_a_typical_event_is_byte_identical_to_protobufs() -> None:
    spec = HealthEventSpec(
        agent="nvdaemon",
        node_name="node-a",
        check_name="NvdaemonGpuXidError",
        component_class="GPU",
        is_fatal=True,
        is_healthy=False,
        message="XID 48: double bit ECC error",
        recommended_action="COMPONENT_RESET",
        error_code=("48",),
        entities=(Entity("GPU", "0"), Entity("PCI", "0000:3b:00.0")),
        processing_strategy="EXECUTE_REMEDIATION",
    )
    ours = to_proto(spec, now=1_764_000_000.25, event_id="id-1")
    assert ours == with_protobuf(spec, now=1_764_000_000.25, event_id="id-1").SerializeToString()


@given(st.integers(-(2**63), 2**64 - 1))
def test_varint_round_trips_through_protobuf(n: int) -> None:
    """int64 (negative: 10 bytes) and uint64 values, as protobuf's own decoder reads them."""
    from google.protobuf.internal import decoder

    value, end = decoder._DecodeVarint(varint(n), 0)  # type: ignore[attr-defined]
    assert (value, end) == (n % 2**64, len(varint(n)))
