"""XID and lost-GPU events. Pure: no I/O, no trio.

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
