"""XID and lost-GPU events. Pure: no I/O, no trio.

XID severity (``XID_SEVERITY``): critical where the GPU needs a reset or the node a reboot (48 double-bit ECC,
62 micro-controller halt, 64 row-remapper failure, 74 NVLink, 79 fallen off the bus, 95 uncontained ECC, 119/120
GSP), info where the fault is the application's (13, 31, 43, 45), warning for every other code.
"""

from __future__ import annotations

from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.nvml import GpuIdentity, XidNotice, device_name
from nvdaemon.sinks.nvsentinel_map import XID_CONDITION, XID_DESCRIPTIONS

LOST_CONDITION = "gpu_lost"
XID_CRITICAL = frozenset({48, 62, 64, 74, 79, 95, 119, 120})
XID_INFO = frozenset({13, 31, 43, 45})


def xid_severity(xid: int) -> str:
    if xid in XID_CRITICAL:
        return "critical"
    return "info" if xid in XID_INFO else "warning"


def xid_description(xid: int) -> str:
    return XID_DESCRIPTIONS.get(xid, "unknown XID")


def xid_event(notice: XidNotice, ident: GpuIdentity, *, node: str, seq: int, now: float) -> Event:
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
        detail={
            "xid": notice.xid,
            "description": xid_description(notice.xid),
            "gpu_uuid": ident.uuid,
            "pci_bus_id": ident.pci_bus_id,
        },
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
) -> Event:
    detail: dict[str, object] = {"gpu_uuid": ident.uuid, "pci_bus_id": ident.pci_bus_id}
    if error:
        detail["error"] = error
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
