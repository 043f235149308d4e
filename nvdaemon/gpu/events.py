"""XID and lost-GPU events, and which GPU a lost-GPU ENTER names. Pure: no I/O, no trio.

An XID event's description and severity come from the one catalogue (``gpu/xid_catalogue.py``), which also holds
NVIDIA's recommended action and fatality that the NVSentinel sink sends; the severity is the Go agent's table
(nodevitals-contract.md §3), raised for 62 and 140, never lowered.
"""

from __future__ import annotations

from nvdaemon.gpu import xid_catalogue
from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.nvml import GpuIdentity, XidNotice, device_name

XID_CONDITION = "gpu_xid_error"  # the gpu tier's XID events (the NVSentinel sink maps them to NvdaemonGpuXidError)
LOST_CONDITION = "gpu_lost"  # the gpu tier's lost-GPU events (NvdaemonGpuFallenOff)


def xid_severity(xid: int) -> str:
    return xid_catalogue.xid_severity(xid)


def xid_description(xid: int) -> str:
    return xid_catalogue.xid_description(xid)


def with_pods(detail: dict[str, object], pods: list[dict[str, str]] | None) -> dict[str, object]:
    """``detail.pods``, ``[{namespace, pod, container}]``, when pod attribution knows the holders (``[]``: none)."""
    if pods is not None:
        detail["pods"] = [dict(p) for p in pods]
    return detail


def xid_event(
    notice: XidNotice, ident: GpuIdentity, *, node: str, seq: int, now: float, pods: list[dict[str, str]] | None = None
) -> Event:
    return Event(
        id=new_event_id(now),
        node=node,
        tier="gpu",
        device=device_name(ident.index if notice.index is not None else -1),
        condition=XID_CONDITION,
        phase=Phase.ENTER,
        severity=xid_severity(notice.xid),
        seq=seq,
        started_at=now,
        detail=with_pods(
            {
                "xid": notice.xid,
                "description": xid_description(notice.xid),
                "gpu_uuid": ident.uuid,
                "pci_bus_id": ident.pci_bus_id,
            },
            pods,
        ),
    )


def gpu_lost_event(
    ident: GpuIdentity,
    *,
    node: str,
    seq: int,
    now: float,
    started_at: float | None = None,
    recovered: bool = False,
    error: str = "",
    pods: list[dict[str, str]] | None = None,
) -> Event:
    detail: dict[str, object] = {"gpu_uuid": ident.uuid, "pci_bus_id": ident.pci_bus_id}
    if error:
        detail["error"] = error
    with_pods(detail, pods)
    return Event(
        id=new_event_id(now),
        node=node,
        tier="gpu",
        device=device_name(ident.index),
        condition=LOST_CONDITION,
        phase=Phase.EXIT if recovered else Phase.ENTER,
        severity="critical",
        seq=seq,
        started_at=now if started_at is None else started_at,
        ended_at=now if recovered else None,
        detail=detail,
    )


def _index(device: str) -> int:
    """``gpu5`` -> 5; -1 for ``gpu`` (index unknown)."""
    tail = device.removeprefix("gpu")
    return int(tail) if device.startswith("gpu") and tail.isdigit() else -1


def _pods(detail: dict[str, object]) -> list[dict[str, str]] | None:
    pods = detail.get("pods")
    if not isinstance(pods, list):
        return None
    return [{str(k): str(v) for k, v in p.items()} for p in pods if isinstance(p, dict)]


def is_lost_gpu(lost: tuple[str, str, str], answering: tuple[str, str, str]) -> bool:
    """Is the GPU ``answering`` (device, uuid, pci bus id) the one recorded ``lost`` (the same three)? By UUID when
    the record has one (an index moves when a GPU is gone after a reboot), else by PCI address, else by device. The
    one rule for the gpu tier's EXIT (``same_gpu``) and the NVSentinel sink's clear (``LostGpu.answers``), so the
    two always clear the same GPU."""
    device, uuid, pci = lost
    if uuid:
        return answering[1] == uuid
    if pci:
        return answering[2] == pci
    return answering[0] == device


def same_gpu(enter: Event, ident: GpuIdentity) -> bool:
    """Is ``ident`` the GPU this ``gpu_lost`` ENTER named (``is_lost_gpu``)?"""
    lost = (enter.device, str(enter.detail.get("gpu_uuid") or ""), str(enter.detail.get("pci_bus_id") or ""))
    return is_lost_gpu(lost, (device_name(ident.index), ident.uuid, ident.pci_bus_id))


def gpu_lost_exit(enter: Event, ident: GpuIdentity, *, node: str, seq: int, now: float) -> Event:
    """The EXIT of ``enter`` now that ``ident`` (``same_gpu``) answers: on the ENTER's device, with its start and
    its holders (``detail.pods``), so that a receiver pairs the two even after a restart of the agent or when the
    GPU came back at another index; the identity as NVML gives it now, else as the ENTER had it."""
    d = enter.detail
    known = GpuIdentity(
        _index(enter.device),
        ident.uuid or str(d.get("gpu_uuid") or ""),
        ident.name,
        ident.pci_bus_id or str(d.get("pci_bus_id") or ""),
    )
    return gpu_lost_event(
        known, node=node, seq=seq, now=now, started_at=enter.started_at, recovered=True, pods=_pods(d)
    )
