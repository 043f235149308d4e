"""The committed pod-resources stubs are exactly what ``make proto`` generates from protos/podresources.proto, and
the wire names and numbers are the kubelet's podresources v1 API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nvdaemon.proto import podresources_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("podresources_pb2.py", "podresources_pb2.pyi", "podresources_pb2_grpc.py")


def test_regenerating_the_stubs_changes_nothing(tmp_path: Path) -> None:
    # The same command as the Makefile's `proto` target, into tmp_path.
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-Invdaemon/proto=protos",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        "nvdaemon/proto/podresources.proto",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    for name in GENERATED:
        fresh = (tmp_path / "nvdaemon" / "proto" / name).read_bytes()
        committed = (ROOT / "nvdaemon" / "proto" / name).read_bytes()
        assert fresh == committed, f"nvdaemon/proto/{name} is stale: run `make proto`"
    makefile = (ROOT / "Makefile").read_text()
    assert "--grpc_python_out=. \\\n\t\tnvdaemon/proto/podresources.proto" in makefile


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
