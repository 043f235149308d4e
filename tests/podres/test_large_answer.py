"""A large kubelet answer, from a real gRPC test kubelet on a Unix socket: a ``List`` over the answer limit is
refused before it is read, counted (``too_large``) and logged, and turns attribution off; what is read keeps only
the containers holding GPU devices, with bounded counts and lengths."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from nvdaemon.gpu import GpuRuntime
from nvdaemon.gpu.podresources import PodAttribution, PodResourcesClient, refresh
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.proto import podresources_pb2 as pb
from tests.gpu.conftest import HEALTHY
from tests.podres.kubelet import TestKubelet, pod

UUIDS = [d["uuid"] for d in json.loads(HEALTHY.read_text())["devices"]]
GPU = "nvidia.com/gpu"
TRAIN = pod("ml", "train", ("main", [(GPU, [UUIDS[0]])]), ("sidecar", []))
LIMIT = 1024 * 1024  # the documented answer limit


def tiny_pods(n: int) -> list[pb.PodResources]:
    """``n`` pods with one container and no devices each (39 bytes each on the wire)."""
    return [pod("default", f"tiny-web-pod-{i:06d}", ("app", [])) for i in range(n)]


def size(pods: list[pb.PodResources]) -> int:
    return len(pb.ListPodResourcesResponse(pod_resources=pods).SerializeToString())


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[TestKubelet]:
    with TestKubelet(tmp_path / "kubelet.sock") as k:
        yield k


def runtime() -> GpuRuntime:
    fake = FakeNvml(HEALTHY)
    return GpuRuntime(fake, fake.open(), node="n")


async def test_an_answer_over_the_limit_is_refused_counted_and_turns_attribution_off(
    kubelet: TestKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvdaemon.gpu.podresources")
    rt, changes = runtime(), []
    pa = PodAttribution(PodResourcesClient(str(kubelet.socket_path), timeout=30))
    limiter = trio.CapacityLimiter(1)
    kubelet.set_pods(TRAIN)
    await refresh(rt, pa, limiter, lambda: changes.append(1))
    assert pa.up and pa.pods(0) == [{"namespace": "ml", "pod": "train", "container": "main"}]

    big = [*tiny_pods(100_000), TRAIN]  # the 3.9 MB, just under grpcio's own 4 MiB
    assert 3_800_000 < size(big) < 4 * 1024 * 1024
    kubelet.set_pods(*big)
    await refresh(rt, pa, limiter, lambda: changes.append(1))
    assert pa.failures["too_large"] == 1 and sum(pa.failures.values()) == 1
    # Off, not the last mapping: those pods may have gone since (unknown, not stale labels on GPU series).
    assert not pa.up and pa.pods(0) is None and changes == [1, 1]
    assert "pod attribution off: kubelet pod-resources too_large: answer over the 1024 KiB limit" in caplog.text

    kubelet.set_pods(*tiny_pods(1000), TRAIN)  # a busy but real node: read again
    await refresh(rt, pa, limiter, lambda: changes.append(1))
    assert pa.up and pa.pods(0) == [{"namespace": "ml", "pod": "train", "container": "main"}]


async def test_only_gpu_holders_are_kept_from_what_is_read(kubelet: TestKubelet) -> None:
    nics = [pod("net", f"nic-{i}", ("main", [("example.com/nic", [f"vf{i}"])])) for i in range(2000)]
    pods = [*tiny_pods(10_000), *nics, TRAIN]
    assert size(pods) < LIMIT
    kubelet.set_pods(*pods)
    pa = PodAttribution(PodResourcesClient(str(kubelet.socket_path), timeout=30))
    allocs = await trio.to_thread.run_sync(pa.call_list)
    assert [(a.pod, a.resource) for a in allocs] == [("train", GPU)]  # not the 2000 NIC rows


async def test_too_many_gpu_device_ids_is_too_large(kubelet: TestKubelet) -> None:
    ids = [f"{UUIDS[0]}::{i}" for i in range(5000)]  # no node has 5000 GPU replicas
    kubelet.set_pods(pod("ml", "greedy", ("main", [(GPU, ids)])))
    assert size(kubelet.pods) < LIMIT
    rt, pa = runtime(), PodAttribution(PodResourcesClient(str(kubelet.socket_path), timeout=30))
    await refresh(rt, pa, trio.CapacityLimiter(1), lambda: None)
    assert not pa.up and pa.failures["too_large"] == 1


async def test_names_ids_and_unmatched_are_bounded(kubelet: TestKubelet) -> None:
    long = "p" * 200_000
    unknown = [f"GPU-{i:036d}" for i in range(1000)]  # nvidia.com ids naming no GPU of this node
    kubelet.set_pods(
        pod("ml", long, (long, [(GPU, [UUIDS[1], "x" * 100_000])])), pod("ml", "u", ("m", [(GPU, unknown)]))
    )
    rt, pa = runtime(), PodAttribution(PodResourcesClient(str(kubelet.socket_path), timeout=30))
    await refresh(rt, pa, trio.CapacityLimiter(1), lambda: None)
    assert pa.current is not None
    (holder,) = pa.current.holders[1]
    assert len(holder.pod) == len(holder.container) == 253  # Kubernetes' longest name
    assert len(pa.current.unmatched) == 64 and max(len(u) for u in pa.current.unmatched) <= 256
