"""One XID, one event: the XIDs NVML and the kernel log report, merged and folded. No I/O, no trio; time passed in.

Two sources report XIDs: NVML's event set (``gpu/xid.py``) and the kernel log (``nvdaemon/kmsg``), and a fault the
driver raises usually reaches both within milliseconds. Each report goes through ``XidLedger.report``:

- a (GPU, XID) not seen lately opens a *fold*. When both sources are live, the fold waits at most ``merge_seconds``
  for the other one, and its one ``gpu_xid_error`` ENTER goes out as soon as both reported, or at the deadline
  (``due``) with the one that did; with one source live it goes out at once. ``detail.sources`` names them.
- a report of an XID already sent for that GPU is counted in its fold (``count``, ``sources``), not sent again: a
  storm of XID 95 stays one event. The fold ends, silently, ``repeat_seconds`` after its last report (a later XID is
  a new fault), on a recovery signal for that GPU (``recover``: the kernel's reset marker, XID 154 with recovery
  action None), or on a reboot (the kernel log source drops every fold then).

XID events stay ENTER only, never an EXIT (nodevitals-contract.md §3); the end of a fold is not an event. A recovery
is: an info ``gpu_xid_recovered`` naming the XIDs it ended, which the NVSentinel sink clears those XIDs on.

GPUs are matched by PCI address (``pci_key``: NVML's ``00000000:3B:00.0`` and the kernel's ``0000:3b:00`` are the
same GPU), else by NVML index. ``folds()`` / ``restore()`` carry the sent folds across a restart of the agent.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import msgspec

from nvdaemon.gpu.events import xid_event
from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.nvml import GpuIdentity, XidNotice, device_name

RECOVERED_CONDITION = "gpu_xid_recovered"  # info, ENTER only: the XIDs a recovery signal ended on one GPU
SOURCES = ("kmsg", "nvml")
MESSAGE_MAX = 512  # characters of the kernel's line kept in detail.message

_PCI = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.[0-7])?$")


def pci_key(address: str) -> str:
    """A PCI address as ``dddd:bb:dd`` (domain, bus, device; the function dropped, lower case): NVML writes
    ``00000000:3B:00.0``, the kernel's NVRM lines ``0000:3b:00``. "" when it is not one."""
    m = _PCI.match(address.strip())
    if m is None:
        return ""
    domain, bus, dev = m.group(1) or "0", m.group(2), m.group(3)
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}"


class XidFold(msgspec.Struct):
    """The reports of one XID on one GPU since it was first seen."""

    gpu: str  # pci_key, or gpu<index> when no PCI address is known
    xid: int
    first_at: float
    last_at: float
    deadline: float  # while unsent: sent by then
    sources: list[str]
    count: int = 1
    sent: bool = False
    index: int = -1
    uuid: str = ""
    pci_bus_id: str = ""
    message: str = ""  # the kernel's line, when the kernel log reported it
    subcode: str = ""  # NVLink5 XIDs 144-150: the unit and link the line names


class XidLedger:
    """The folds, keyed (gpu, xid). ``emit`` publishes events; ``next_seq`` draws their seq; ``identity(pci_key)``
    is NVML's identity of a GPU by address (None when NVML does not know it); ``pods(index)`` its holders."""

    def __init__(
        self,
        *,
        node: str,
        emit: Callable[[list[Event]], None],
        next_seq: Callable[[], int],
        merge_seconds: float = 2.0,
        repeat_seconds: float = 3600.0,
    ) -> None:
        self.node = node
        self.emit = emit
        self.next_seq = next_seq
        self.merge_seconds = merge_seconds
        self.repeat_seconds = repeat_seconds
        self.live: set[str] = set()  # the sources reporting now: a fold waits only for a live one
        self.identity: Callable[[str], GpuIdentity | None] = lambda key: None
        self.pods: Callable[[int], list[dict[str, str]] | None] = lambda index: None
        self._folds: dict[tuple[str, int], XidFold] = {}
        self.armed: Callable[[], None] = lambda: None  # called when a new deadline may be earlier than the last

    # ---- reports -------------------------------------------------------------------------------------------------
    def report(
        self,
        source: str,
        xid: int,
        now: float,
        *,
        ident: GpuIdentity | None = None,
        pci: str = "",
        message: str = "",
        subcode: str = "",
    ) -> list[Event]:
        """One XID from ``source`` (``kmsg`` or ``nvml``); the events it let out (published already)."""
        key_pci = pci_key(pci or (ident.pci_bus_id if ident is not None else ""))
        if ident is None and key_pci:
            ident = self.identity(key_pci)
        index = ident.index if ident is not None else -1
        gpu = key_pci or device_name(index)
        fold = self._folds.get((gpu, xid))
        if fold is not None and fold.sent and now - fold.last_at >= self.repeat_seconds:
            fold = None  # quiet long enough: a new fault (``due`` drops such folds too, where a task calls it)
        if fold is None:
            fold = XidFold(gpu, xid, now, now, now + self.merge_seconds, [source])
            self._folds[(gpu, xid)] = fold
            self.armed()
        else:
            fold.count += 1
            fold.last_at = max(fold.last_at, now)
            if source not in fold.sources:
                fold.sources.append(source)
        if ident is not None:
            fold.index = ident.index if ident.index >= 0 else fold.index
            fold.uuid = ident.uuid or fold.uuid
            fold.pci_bus_id = ident.pci_bus_id or fold.pci_bus_id
        fold.pci_bus_id = fold.pci_bus_id or pci
        fold.message = fold.message or message[:MESSAGE_MAX]
        fold.subcode = fold.subcode or subcode
        if fold.sent:
            return []
        waiting_for = [s for s in self.live if s not in fold.sources]
        if waiting_for and now < fold.deadline:
            return []
        return self._send([fold], now)

    def due(self, now: float) -> list[Event]:
        """Send the folds whose merge deadline passed; drop the sent ones quiet for ``repeat_seconds``."""
        ready = [f for f in self._folds.values() if not f.sent and f.deadline <= now]
        for key in [k for k, f in self._folds.items() if f.sent and now - f.last_at >= self.repeat_seconds]:
            del self._folds[key]
        return self._send(ready, now)

    def next_deadline(self) -> float | None:
        """When ``due`` has something to do next (None: nothing held)."""
        times = [f.deadline if not f.sent else f.last_at + self.repeat_seconds for f in self._folds.values()]
        return min(times, default=None)

    def recover(
        self, now: float, *, pci: str = "", uuid: str = "", ident: GpuIdentity | None = None, signal: str
    ) -> list[Event]:
        """A recovery signal for one GPU (by PCI address, UUID or NVML identity): its folds end, and one
        ``gpu_xid_recovered`` names the XIDs they held. Nothing when it held none (a driver load is no news)."""
        key_pci = pci_key(pci or (ident.pci_bus_id if ident is not None else ""))
        uuid = uuid or (ident.uuid if ident is not None else "")
        if ident is None and key_pci:
            ident = self.identity(key_pci)
        ended = [f for f in self._folds.values() if (key_pci and f.gpu == key_pci) or (uuid and f.uuid == uuid)]
        if not ended:
            return []
        for f in ended:
            del self._folds[(f.gpu, f.xid)]
        first = ended[0]
        index = ident.index if ident is not None and ident.index >= 0 else first.index
        where = first.pci_bus_id or pci
        ev = Event(
            id=new_event_id(now),
            node=self.node,
            tier="gpu",
            device=device_name(index) if index >= 0 else (where or "gpu"),
            condition=RECOVERED_CONDITION,
            phase=Phase.ENTER,
            severity="info",
            seq=self.next_seq(),
            started_at=now,
            detail={
                "signal": signal,
                "xids": sorted(f.xid for f in ended),
                "gpu_uuid": uuid or first.uuid,
                "pci_bus_id": where,
            },
        )
        self.emit([ev])
        return [ev]

    def forget_all(self) -> int:
        """A reboot: every fold ends (the faults were the previous boot's). How many there were."""
        n = len(self._folds)
        self._folds.clear()
        return n

    # ---- persistence and status ----------------------------------------------------------------------------------
    def folds(self) -> list[XidFold]:
        return sorted(self._folds.values(), key=lambda f: (f.gpu, f.xid))

    def restore(self, folds: Iterable[XidFold]) -> None:
        """The sent folds of the run before (unsent ones were never published: they are not carried)."""
        for f in folds:
            if f.sent:
                self._folds.setdefault((f.gpu, f.xid), f)

    # ---- events --------------------------------------------------------------------------------------------------
    def _send(self, folds: list[XidFold], now: float) -> list[Event]:
        events = []
        for fold in sorted(folds, key=lambda f: f.first_at):
            fold.sent = True
            known = fold.index >= 0
            ident = GpuIdentity(fold.index, fold.uuid, "", fold.pci_bus_id)
            notice = XidNotice(fold.index if known else None, fold.xid)
            pods = self.pods(fold.index) if known else None
            ev = xid_event(notice, ident, node=self.node, seq=self.next_seq(), now=fold.first_at, pods=pods)
            ev.detail["sources"] = sorted(fold.sources)
            if fold.message:
                ev.detail["message"] = fold.message
            if fold.subcode:
                ev.detail["subcode"] = fold.subcode
            if not known and fold.pci_bus_id:  # NVML does not know this GPU: it is named by its bus id
                ev = msgspec.structs.replace(ev, device=fold.pci_bus_id)
            events.append(ev)
        if events:
            self.emit(events)
        return events
