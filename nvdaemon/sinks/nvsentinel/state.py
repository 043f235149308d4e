"""What the NVSentinel sink keeps in ``stateDir/nvsentinel.json`` (JSON, camelCase keys) and the records it builds
from bus events: what the platform-connector acknowledged (``reported``), the checks already baselined, the XIDs
raised since the boot recorded in ``bootId`` (``<procRoot>/sys/kernel/random/boot_id``), and the GPUs lost.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from nvdaemon.model import Event
from nvdaemon.sinks import spool_clock
from nvdaemon.sinks.nvsentinel.map import Health, LostGpu, XidRecord, pods_text

STATE_FILE = "nvsentinel.json"
BOOT_ID = Path("sys/kernel/random/boot_id")  # under procRoot


class Persisted(msgspec.Struct, rename="camel"):
    version: int = 1
    boot_id: str = ""
    baselined: list[str] = msgspec.field(default_factory=list)
    reported: list[Health] = msgspec.field(default_factory=list)
    xids: list[XidRecord] = msgspec.field(default_factory=list)
    lost: list[LostGpu] = msgspec.field(default_factory=list)


def xid_record(ev: Event) -> XidRecord | None:
    """An XID event of the GPU tier: condition ``gpu_xid_error``, detail ``{xid, description, gpu_uuid, pci_bus_id}``
    and ``pods`` under pod attribution (nvdaemon/gpu/events.py); where the tier did not know the uuid or PCI address,
    the device stands for the GPU."""
    d = ev.detail
    try:
        xid = int(str(d.get("xid")))
    except ValueError:
        return None
    return XidRecord(
        xid=xid,
        device=ev.device,
        pci=str(d.get("pci_bus_id") or ""),
        uuid=str(d.get("gpu_uuid") or ""),
        description=str(d.get("description") or ""),
        at=ev.started_at,
        pods=pods_text(d.get("pods")),
    )


def lost_record(ev: Event) -> LostGpu:
    """A ``gpu_lost`` event of the GPU tier: device ``gpu<index>``, detail ``{gpu_uuid, pci_bus_id, error}`` and
    ``pods`` under pod attribution (nvdaemon/gpu/events.py), the identity the tier last knew."""
    d = ev.detail
    return LostGpu(
        device=ev.device,
        pci=str(d.get("pci_bus_id") or ""),
        uuid=str(d.get("gpu_uuid") or ""),
        error=str(d.get("error") or ""),
        at=ev.started_at,
        pods=pods_text(d.get("pods")),
    )


def read_boot_id(path: Path | None) -> str | None:
    """The boot id at ``path`` (``spool_clock.read_boot_id``); None without a path."""
    return None if path is None else spool_clock.read_boot_id(path)
