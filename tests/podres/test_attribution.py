"""The matcher: device ids in every form device plugins hand out, to this node's GPUs (pure, tables)."""

from __future__ import annotations

import pytest

from nvdaemon.gpu.attribution import Allocation, Holder, attribute, keys_for, resolve

U0 = "GPU-0b3c4e21-7d52-4f0a-9c1e-5a6b7c8d9e01"
U1 = "GPU-1c4d5f32-8e63-4a1b-8d2f-6b7c8d9e0f12"
MIG = "MIG-5f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0"
KEYS = keys_for([(0, U0, ()), (1, U1, (MIG,)), (2, "", ())])


@pytest.mark.parametrize(
    ("device_id", "expected"),
    [
        (U0, (0, False)),  # DEVICE_ID_STRATEGY=uuid
        (U1 + "::3", (1, False)),  # time-slicing replica 3
        ("2", (2, False)),  # DEVICE_ID_STRATEGY=index
        ("nvidia1", (1, False)),  # GKE
        ("nvidia0/vgpu2", (0, False)),  # GKE time-sharing
        (MIG, (1, True)),  # R470+ MIG device UUID, parent through NVML
        (MIG + "::1", (1, True)),  # shared MIG slice
        (f"MIG-{U0}/1/0", (0, True)),  # pre-R470 MIG id names its parent
        (f"MIG-{U0}/1/0::2", (0, True)),  # shared, pre-R470
        ("1:0::1", (1, True)),  # shared, index strategy
        ("1:0", (1, True)),  # index strategy, MIG slice 0 of GPU 1
        ("nvidia0/gi2", (0, True)),  # GKE MIG
        ("nvidia0/gi2/vgpu1", (0, True)),
        ("7", None),  # no GPU 7 on this node
        ("GPU-ffffffff-0000-0000-0000-000000000000", None),
        ("MIG-00000000-0000-0000-0000-000000000000", None),
        ("", None),
        ("nvidia", None),
    ],
)
def test_resolve(device_id: str, expected: tuple[int, bool] | None) -> None:
    assert resolve(device_id, KEYS) == expected


def test_attribute_holders_dcgm_holder_and_what_is_ignored() -> None:
    allocs = [
        Allocation("ml", "shared-a", "worker", "nvidia.com/gpu", (U1 + "::0",)),
        Allocation("ml", "train", "main", "nvidia.com/gpu", (U0, "2")),
        Allocation("ml", "shared-b", "worker", "nvidia.com/gpu", (U1 + "::1",)),
        Allocation("mig", "slice", "main", "nvidia.com/mig-1g.10gb", (MIG,)),
        Allocation("fpga", "x", "main", "xilinx.com/fpga", ("0",)),  # not a GPU resource: GPU 0 is not its
        Allocation("ml", "ghost", "main", "nvidia.com/gpu", ("GPU-gone",)),
    ]
    a = attribute(allocs, KEYS)
    assert a.holders == {
        0: (Holder("ml", "train", "main"),),
        1: (Holder("mig", "slice", "main"), Holder("ml", "shared-a", "worker"), Holder("ml", "shared-b", "worker")),
        2: (Holder("ml", "train", "main"),),
    }
    # dcgm-exporter: the last whole-GPU holder the kubelet listed; a MIG slice never labels the parent's series
    assert a.dcgm == {0: Holder("ml", "train", "main"), 1: Holder("ml", "shared-b", "worker"), 2: a.dcgm[0]}
    assert a.unmatched == ("GPU-gone",)
    assert a.pods(1)[0] == {"namespace": "mig", "pod": "slice", "container": "main"}
    assert a.pods(5) == []


def test_a_mig_slice_alone_labels_nothing_on_the_dcgm_surface() -> None:
    a = attribute([Allocation("mig", "slice", "main", "nvidia.com/mig-1g.10gb", (MIG,))], KEYS)
    assert a.holders == {1: (Holder("mig", "slice", "main"),)} and a.dcgm == {}
