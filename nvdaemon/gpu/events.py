"""XID and lost-GPU events. Pure: no I/O, no trio.

XID severity, the one webhook and stream receivers see (``xid_severity``), is the Go agent's table
(nodevitals-contract.md §3): info for 13, 31, 43 (the application's fault); warning for 63, 74, 92, 94 and every
code it does not list; critical for 48, 64, 79, 95, 119, 120. Of the codes in our catalogue that Go leaves to
"unknown", 62 (micro-controller halt) and 140 (unrecovered ECC) are critical, since the GPU needs a reset; 45 and
61 stay warning. The rule for such codes: raise above Go's answer, never lower it, so a receiver that alerted on a
severity under the Go agent still alerts. NVIDIA's recommended action and fatality are NVSentinel's business
(``XID_CATALOGUE`` in nvdaemon/sinks/nvsentinel_xid.py, with its sources) and do not follow this table.
"""

from __future__ import annotations

from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.nvml import GpuIdentity, XidNotice, device_name
from nvdaemon.sinks.nvsentinel_map import LOST_CONDITION, XID_CONDITION
from nvdaemon.sinks.nvsentinel_xid import XID_DESCRIPTIONS

GO_XID_SEVERITY: dict[int, str] = {
    **dict.fromkeys((13, 31, 43), "info"),
    **dict.fromkeys((63, 74, 92, 94), "warning"),
    **dict.fromkeys((48, 64, 79, 95, 119, 120), "critical"),
}
XID_SEVERITY: dict[int, str] = {**GO_XID_SEVERITY, 62: "critical", 140: "critical"}
UNKNOWN_XID_SEVERITY = "warning"


def xid_severity(xid: int) -> str:
    return XID_SEVERITY.get(xid, UNKNOWN_XID_SEVERITY)


def xid_description(xid: int) -> str:
    return XID_DESCRIPTIONS.get(xid, "unknown XID")


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
