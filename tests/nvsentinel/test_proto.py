"""The committed stubs are exactly what ``make proto`` generates from protos/health_event.proto, and the wire
names match NVSentinel's contract (DESIGN §8)."""

from __future__ import annotations

from pathlib import Path

from nvdaemon.proto import health_event_pb2 as pb
from tests.protostubs import assert_stubs_fresh


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    assert_stubs_fresh("health_event", tmp_path)


def test_wire_contract() -> None:
    service = pb.DESCRIPTOR.services_by_name["PlatformConnector"]
    method = service.methods_by_name["HealthEventOccurredV1"]
    assert service.full_name == "datamodels.PlatformConnector"
    assert (method.input_type.full_name, method.output_type.full_name) == (
        "datamodels.HealthEvents",
        "google.protobuf.Empty",
    )
    fields = {f.name: f.number for f in pb.HealthEvent.DESCRIPTOR.fields}
    assert fields == {
        "version": 1,
        "agent": 2,
        "componentClass": 3,
        "checkName": 4,
        "isFatal": 5,
        "isHealthy": 6,
        "message": 7,
        "recommendedAction": 8,
        "errorCode": 9,
        "entitiesImpacted": 10,
        "metadata": 11,
        "generatedTimestamp": 12,
        "nodeName": 13,
        "quarantineOverrides": 14,
        "drainOverrides": 15,
        "processingStrategy": 16,
        "id": 17,
        "customRecommendedAction": 18,
    }
    assert dict(pb.RecommendedAction.items()) == {
        "NONE": 0,
        "COMPONENT_RESET": 2,
        "CONTACT_SUPPORT": 5,
        "RUN_FIELDDIAG": 6,
        "RESTART_VM": 15,
        "RESTART_BM": 24,
        "REPLACE_VM": 25,
        "RUN_DCGMEUD": 26,
        "CUSTOM": 27,
        "UNKNOWN": 99,
    }
    assert dict(pb.ProcessingStrategy.items()) == {
        "UNSPECIFIED": 0,
        "EXECUTE_REMEDIATION": 1,
        "STORE_ONLY": 2,
        "STORE_AND_ANALYSE": 3,
    }
    assert {f.name: f.number for f in pb.Entity.DESCRIPTOR.fields} == {"entityType": 1, "entityValue": 2}
    assert {f.name: f.number for f in pb.BehaviourOverrides.DESCRIPTOR.fields} == {"force": 1, "skip": 2}
    assert {f.name: f.number for f in pb.HealthEvents.DESCRIPTOR.fields} == {"version": 1, "events": 2}
