"""Which containers hold which GPU: the kubelet's pod-resources answer matched to this node's GPUs. Pure: no I/O, no
trio, no protobuf (``nvdaemon/gpu/podresources.py`` turns the kubelet's answer into ``Allocation`` rows).

Device ids are what the device plugin handed the kubelet, in any of the forms NVIDIA's and GKE's plugins use:

- ``GPU-<uuid>``: a whole GPU (the NVIDIA plugin's default ``DEVICE_ID_STRATEGY=uuid``);
- ``<index>`` or ``nvidia<index>``: a whole GPU by index (``DEVICE_ID_STRATEGY=index``; GKE's plugin);
- ``<id>::<n>`` or ``<id>/vgpu<n>``: replica ``n`` of a time-sliced or MPS-shared GPU (NVIDIA's plugin; GKE's);
- ``MIG-<uuid>`` (R470+ drivers), ``MIG-GPU-<uuid>/<gi>/<ci>`` (older), ``<index>:<mig>`` (index strategy) and
  ``nvidia<index>/gi<gi>``: a MIG slice, attributed to its parent GPU (``MIG-<uuid>`` through NVML's MIG list).

Only resources named ``nvidia.com/...`` are considered (an FPGA plugin's device ``0`` is not GPU 0).

Two answers per GPU: every holder (``holders``: events carry them all) and the one holder dcgm-exporter's
``--kubernetes`` mode labels the GPU's ``DCGM_FI_*`` series with (``dcgm``): the last whole-GPU allocation in the
kubelet's order, replicas of a shared GPU included; a MIG slice labels only dcgm-exporter's per-GPU-instance series,
which this surface does not serve, so it never labels the parent's (see docs/tiers.md, GPU tier).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

GPU_RESOURCE_PREFIX = "nvidia.com/"
UNMATCHED_KEPT = 64  # unmatched device ids kept (for the log line and comparing answers): the first ones

_REPLICA = re.compile(r"^(?P<base>.+?)(?:::\d+|/vgpu\d+)$")
_INDEX = re.compile(r"^(?:nvidia)?(?P<index>\d+)$")
_MIG_INDEX = re.compile(r"^(?:(?P<index>\d+):\d+|nvidia(?P<gke>\d+)/gi\d+)$")
_MIG_OLD = re.compile(r"^MIG-(?P<parent>GPU-[0-9A-Fa-f-]+)/\d+/\d+$")


@dataclass(frozen=True, order=True)
class Holder:
    """One container holding (part of) a GPU."""

    namespace: str
    pod: str
    container: str

    def as_json(self) -> dict[str, str]:
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


@dataclass(frozen=True)
class Allocation:
    """One ``ContainerDevices`` entry of the kubelet's answer."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class GpuKeys:
    """How device ids can name this node's GPUs: UUID -> index, MIG device UUID -> parent index, the indices."""

    by_uuid: Mapping[str, int]
    by_mig: Mapping[str, int] = field(default_factory=dict)
    indices: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Attribution:
    holders: dict[int, tuple[Holder, ...]]  # GPU index -> every holder, sorted
    dcgm: dict[int, Holder]  # GPU index -> the holder on its DCGM_FI_* series
    unmatched: tuple[str, ...] = ()  # device ids of nvidia.com resources that name no GPU of this node (the first 64)

    def pods(self, index: int) -> list[dict[str, str]]:
        """``detail.pods`` of an event on GPU ``index``: every holder, ``[]`` when none."""
        return [h.as_json() for h in self.holders.get(index, ())]


def resolve(device_id: str, keys: GpuKeys) -> tuple[int, bool] | None:
    """(GPU index, whether it is a MIG slice) for one device id; None when it names no GPU of this node."""
    if m := _MIG_OLD.match(device_id):
        index = keys.by_uuid.get(m["parent"])
        return None if index is None else (index, True)
    if device_id.startswith("MIG-"):
        if base := _REPLICA.match(device_id):  # a shared MIG slice, in either form: MIG-<uuid>::<n>
            return resolve(base["base"], keys)
        index = keys.by_mig.get(device_id)
        return None if index is None else (index, True)
    if m := _MIG_INDEX.match(device_id):
        index = int(m["index"] or m["gke"])
        return (index, True) if index in keys.indices else None
    if m := _REPLICA.match(device_id):
        return resolve(m["base"], keys)
    if device_id in keys.by_uuid:
        return keys.by_uuid[device_id], False
    if m := _INDEX.match(device_id):
        index = int(m["index"])
        return (index, False) if index in keys.indices else None
    return None


def attribute(allocations: Iterable[Allocation], keys: GpuKeys) -> Attribution:
    """Match every GPU allocation to this node's GPUs, in the kubelet's order (which decides dcgm's holder)."""
    holders: dict[int, set[Holder]] = {}
    dcgm: dict[int, Holder] = {}
    unmatched: list[str] = []
    for alloc in allocations:
        if not alloc.resource.startswith(GPU_RESOURCE_PREFIX):
            continue
        holder = Holder(alloc.namespace, alloc.pod, alloc.container)
        for device_id in alloc.device_ids:
            found = resolve(device_id, keys)
            if found is None:
                if len(unmatched) < UNMATCHED_KEPT:
                    unmatched.append(device_id)
                continue
            index, mig = found
            holders.setdefault(index, set()).add(holder)
            if not mig:
                dcgm[index] = holder  # dcgm-exporter keeps the last one it meets
    return Attribution(
        holders={i: tuple(sorted(hs)) for i, hs in sorted(holders.items())},
        dcgm=dict(sorted(dcgm.items())),
        unmatched=tuple(unmatched),
    )


def keys_for(identities: Iterable[tuple[int, str, Iterable[str]]]) -> GpuKeys:
    """``GpuKeys`` from (index, UUID, MIG device UUIDs) per GPU."""
    by_uuid: dict[str, int] = {}
    by_mig: dict[str, int] = {}
    indices = set()
    for index, uuid, migs in identities:
        indices.add(index)
        if uuid:
            by_uuid[uuid] = index
        for mig in migs:
            by_mig[mig] = index
    return GpuKeys(by_uuid=by_uuid, by_mig=by_mig, indices=frozenset(indices))
