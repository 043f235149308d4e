"""The committed pod-resources stubs are exactly what ``make proto`` generates from protos/podresources.proto, and
the wire names and numbers are the kubelet's podresources v1 API."""

from __future__ import annotations

from pathlib import Path

from nvdaemon.proto import podresources_pb2 as pb
from tests.protostubs import assert_stubs_fresh


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    assert_stubs_fresh("podresources", tmp_path)


def numbers(message: type) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]


def test_wire_contract() -> None:
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"  # method path /v1.PodResourcesLister/List
    methods = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert methods == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }
    assert numbers(pb.ListPodResourcesResponse) == {"pod_resources": 1}
    assert numbers(pb.PodResources) == {"name": 1, "namespace": 2, "containers": 3}
    assert numbers(pb.ContainerResources) == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert numbers(pb.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert numbers(pb.TopologyInfo) == {"nodes": 1} and numbers(pb.NUMANode) == {"ID": 1}
    assert numbers(pb.ContainerMemory) == {"memory_type": 1, "size": 2, "topology": 3}
    assert numbers(pb.DynamicResource) == {"class_name": 1, "claim_name": 2, "claim_namespace": 3, "claim_resources": 4}
    assert numbers(pb.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}
    assert numbers(pb.GetPodResourcesResponse) == {"pod_resources": 1}
    assert numbers(pb.AllocatableResourcesResponse) == {"devices": 1, "cpu_ids": 2, "memory": 3}
