"""The pod-resources client against a real gRPC test kubelet on a Unix socket: List, Get (offered or not), and a
socket that is missing, refuses, hangs or answers garbage, each a ``PodResourcesError`` with its reason."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvdaemon.gpu.attribution import Allocation
from nvdaemon.gpu.podresources import PodResourcesClient, PodResourcesError
from tests.podres.kubelet import TestKubelet, pod

U0 = "GPU-0b3c4e21-7d52-4f0a-9c1e-5a6b7c8d9e01"


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[TestKubelet]:
    with TestKubelet(tmp_path / "kubelet.sock") as k:
        k.set_pods(
            pod("ml", "train", ("main", [("nvidia.com/gpu", [U0])]), ("sidecar", [])),
            pod("ml", "cpu-only", ("main", [("example.com/nic", ["vf0", "vf1"])])),
        )
        yield k


def test_list_and_get(kubelet: TestKubelet) -> None:
    client = PodResourcesClient(str(kubelet.socket_path), timeout=30)
    assert client.list_allocations() == [
        Allocation("ml", "train", "main", "nvidia.com/gpu", (U0,)),
        Allocation("ml", "cpu-only", "main", "example.com/nic", ("vf0", "vf1")),
    ]
    assert client.get_allocations("ml", "train") == [Allocation("ml", "train", "main", "nvidia.com/gpu", (U0,))]
    with pytest.raises(PodResourcesError) as err:
        client.get_allocations("ml", "nope")
    assert err.value.reason == "error" and "not found" in str(err.value)


def test_get_not_offered_is_none(tmp_path: Path) -> None:
    with TestKubelet(tmp_path / "k.sock", get=False) as k:
        k.set_pods(pod("ml", "train", ("main", [("nvidia.com/gpu", [U0])])))
        client = PodResourcesClient(str(k.socket_path), timeout=30)
        assert client.get_allocations("ml", "train") is None
        assert len(client.list_allocations()) == 1


def reason(client: PodResourcesClient) -> str:
    with pytest.raises(PodResourcesError) as err:
        client.list_allocations()
    return err.value.reason


def test_missing_socket_and_not_a_socket(tmp_path: Path) -> None:
    assert reason(PodResourcesClient(str(tmp_path / "absent.sock"), timeout=1)) == "missing"
    (tmp_path / "file").write_text("x")
    assert reason(PodResourcesClient(str(tmp_path / "file"), timeout=1)) == "missing"


def test_refused(tmp_path: Path) -> None:
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # a socket file nobody listens on: what a crashed kubelet leaves
        assert reason(PodResourcesClient(str(path), timeout=2)) == "refused"


def test_hang_is_a_timeout_and_garbage_is_garbage(kubelet: TestKubelet) -> None:
    kubelet.set_mode("hang")
    assert reason(PodResourcesClient(str(kubelet.socket_path), timeout=0.3)) == "timeout"
    # A generous deadline for the answers that do come, so that a busy machine cannot turn them into timeouts.
    client = PodResourcesClient(str(kubelet.socket_path), timeout=30)
    kubelet.set_mode("garbage")
    assert reason(client) == "garbage"
    kubelet.set_mode("ok")
    assert len(client.list_allocations()) == 2
