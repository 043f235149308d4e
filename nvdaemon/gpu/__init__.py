"""The GPU runtime: the NVML backend the agent opened at start, its limiter, and what the gpu tier, the XID source
and the dcgm-exporter surface share (identities, driver version, XID counts, lost GPUs).

Start (``open_gpu``, before the root nursery): when the tiers to run include gpu, pick the backend (``gpu.backend``:
``auto`` = the fake when ``gpu.fakeScenario`` is set, else NVML; reads the scenario file or loads libnvidia-ml) and
open it in a worker thread. NVML unusable (no libnvidia-ml, driver not loaded): with other tiers, one warning
"skipping gpu tier" and a ``GpuStart`` naming gpu as skipped, which the caller leaves out of the tiers it runs; when
gpu is the only tier, ``NvmlUnavailable`` propagates and ``nvdaemon run`` exits 1.

Stop (``close_gpu``, after the tier loops and the XID source are stopped): wait for any abandoned NVML thread (at
most ``CLOSE_WAIT_SECONDS``), then nvmlShutdown. The XID source has freed its event set by then (its wait thread
returned first).

Nothing here holds the agent: ``open_gpu`` gets the ``gpu`` config slice, the tiers, the node name and two callbacks
(publish events, draw the next event sequence number) and returns what it opened; the caller keeps it.

Lost GPUs: a GPU whose snapshot raises GPU_IS_LOST gets ``gpu_lost`` ENTER (EXIT once it answers again). The ENTER
of every GPU lost now is kept in the engine state (``lost_gpus``, which ``engine.json`` persists): after a restart
of the agent a GPU still lost is not ENTERed again, and one that answers gets its EXIT, matched by UUID, else PCI
address, else index (``events.same_gpu``, as the NVSentinel sink matches), on the ENTER's device. When the whole
library stops answering while the tier runs (``nvmlDeviceGetCount`` fails: driver unloaded, GPUs gone, the
library wedged), every GPU known at that moment is lost the same way, each with the identity last known: per GPU,
not one node-wide fault, so NVSentinel gets the GPU, PCI and GPU_UUID entities its GPU remediation needs, and each
GPU clears on its own as it answers again (one that stays lost after a driver reload stays reported).
``answering()`` lists the GPUs whose last snapshot succeeded, for the NVSentinel sink to clear a fault raised before
a restart of the agent.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from nvdaemon.collectors.base import Collector
from nvdaemon.gpu.events import gpu_lost_event, gpu_lost_exit, same_gpu
from nvdaemon.gpu.xid_ledger import XidLedger, pci_key
from nvdaemon.model import Event
from nvdaemon.nvml import (
    XID_WAIT_MS,
    GpuIdentity,
    NvmlBackend,
    NvmlUnavailable,
    XidNotice,
    bounded_text,
    device_name,
)
from nvdaemon.shutdown import bounded_shield

if TYPE_CHECKING:
    from nvdaemon.config import GpuConfig
    from nvdaemon.gpu.podresources import PodAttribution

log = logging.getLogger(__name__)

NVML_THREADS = 4  # NVML calls in flight at once: one XID wait plus the tier's snapshot, with room to spare
CLOSE_WAIT_SECONDS = 2.0


class GpuRuntime:
    """Shared by the gpu tier, the XID source and the dcgm-exporter surface; touched only from the trio thread."""

    def __init__(
        self,
        backend: NvmlBackend,
        identities: list[GpuIdentity],
        *,
        node: str,
        driver_version: str = "",
        emit: Callable[[list[Event]], None] = lambda events: None,
        next_seq: Callable[[], int] = lambda: 0,
        xid_wait_ms: int = XID_WAIT_MS,
        lost: dict[str, Event] | None = None,
        ledger: XidLedger | None = None,
    ) -> None:
        self.backend = backend
        self.identities = {g.index: g for g in identities}
        self.node = node
        self.driver_version = driver_version
        self.limiter = trio.CapacityLimiter(NVML_THREADS)
        self.emit = emit
        self.next_seq = next_seq
        self.xid_wait_ms = xid_wait_ms
        self.xid_counts: collections.Counter[tuple[int, int]] = collections.Counter()  # (gpu index, xid) -> n
        self.last_xid: dict[int, int] = {}  # gpu index -> last XID (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS)
        self.lost: dict[int, float] = {}  # gpu index -> since when, for the GPUs this process saw lost
        # ENTER id -> the gpu_lost ENTER of every GPU lost now, those lost before a restart included (until this
        # process sees them): the engine state's ``lost_gpus``, which engine.json persists, when the agent passes it.
        self.lost_by_id: dict[str, Event] = lost if lost is not None else {}
        self.pod_attribution: PodAttribution | None = None  # set by the source:podresources task while it runs
        self._answering: dict[int, GpuIdentity] = {}  # gpu index -> identity, for GPUs whose last snapshot succeeded
        # One XID, one event: NVML's reports and the kernel log's meet here (gpu/xid_ledger.py).
        self.ledger = ledger or XidLedger(node=node, emit=emit, next_seq=next_seq, merge_seconds=0.0)
        self.ledger.identity = self.identity_by_pci
        self.ledger.pods = self.pods

    def collectors(self) -> list[Collector]:
        from nvdaemon.collectors.gpu import GpuCollector

        return [GpuCollector(self)]

    def identity(self, index: int | None) -> GpuIdentity:
        if index is None:
            return GpuIdentity(-1)
        return self.identities.get(index) or GpuIdentity(index)

    def pod_attribution_status(self) -> dict[str, Any] | None:
        """Pod attribution's state for ``/v1/status``, while its task runs."""
        pa = self.pod_attribution
        return pa.status() if pa is not None else None

    def pods(self, index: int | None) -> list[dict[str, str]] | None:
        """The holders of GPU ``index`` for an event's ``detail.pods``; None: attribution off or unknown GPU."""
        pa = self.pod_attribution
        return None if pa is None or index is None or index < 0 else pa.pods(index)

    def pods_of_device(self, device: str) -> list[dict[str, str]] | None:
        """``pods`` by the agent's device name (``gpu<index>``), for the rule engine."""
        index = device.removeprefix("gpu")
        return self.pods(int(index)) if device.startswith("gpu") and index.isdigit() else None

    def identity_by_pci(self, address: str) -> GpuIdentity | None:
        """The identity of the GPU at a PCI address in any spelling (``xid_ledger.pci_key``); None: not one NVML
        knows."""
        key = pci_key(address)
        return next((g for g in self.identities.values() if key and pci_key(g.pci_bus_id) == key), None)

    def learn(self, ident: GpuIdentity) -> None:
        if ident.uuid:
            self.identities[ident.index] = ident

    def on_xids(self, notices: list[XidNotice], now: float | None = None) -> list[Event]:
        """Count the XIDs and report each to the XID ledger, which publishes one event per fault (merged with the
        kernel log's report of it, repeats folded): the events published now."""
        now = time.time() if now is None else now
        events = []
        for n in notices:
            if n.index is not None:
                self.xid_counts[(n.index, n.xid)] += 1
                self.last_xid[n.index] = n.xid
            events += self.ledger.report("nvml", n.xid, now, ident=self.identity(n.index))
        return events

    def set_lost(self, ident: GpuIdentity, lost: bool, now: float, error: str = "") -> None:
        """Publish ``gpu_lost`` ENTER when a GPU stops answering and EXIT when it answers again, once each, across
        restarts of the agent too (``lost_by_id`` comes back from engine.json)."""
        index = ident.index
        if not lost:
            self._answering[index] = ident
            self.lost.pop(index, None)
            for enter in [e for e in self.lost_by_id.values() if same_gpu(e, ident)]:
                del self.lost_by_id[enter.id]
                self.emit([gpu_lost_exit(enter, ident, node=self.node, seq=self.next_seq(), now=now)])
            return
        self._answering.pop(index, None)
        if index in self.lost:
            return
        known = next((e for e in self.lost_by_id.values() if same_gpu(e, ident)), None)
        if known is not None:  # lost before this process started and still lost: its ENTER went out then
            self.lost[index] = known.started_at
            log.info(
                "%s is still lost (gpu_lost ENTER %s, seq %d, before a restart): not raised again",
                device_name(index),
                known.id,
                known.seq,
            )
            return
        self.lost[index] = now
        # The ENTER names the GPU's holders now (pod attribution); its EXIT names the same ones.
        enter = gpu_lost_event(ident, node=self.node, seq=self.next_seq(), now=now, error=error, pods=self.pods(index))
        self.lost_by_id[enter.id] = enter
        self.emit([enter])

    def nvml_down(self, error: str, now: float) -> None:
        """The library stopped answering: every GPU known now is lost (``gpu_lost`` ENTER once each)."""
        for index in sorted(self.identities):
            self.set_lost(self.identity(index), True, now, error)

    def lost_enters(self) -> list[Event]:
        """The ``gpu_lost`` ENTER of every GPU lost now (those lost before a restart included), for a sink that was
        not subscribed when it was published."""
        return sorted(self.lost_by_id.values(), key=lambda e: e.seq)

    def answering(self) -> list[tuple[str, str, str]]:
        """(device, uuid, PCI address) of every GPU whose last snapshot succeeded."""
        return [(device_name(i), g.uuid, g.pci_bus_id) for i, g in sorted(self._answering.items())]


def _backend_for(cfg: GpuConfig) -> NvmlBackend:
    if cfg.backend == "fake" or (cfg.backend == "auto" and cfg.fake_scenario):
        from nvdaemon.nvml.fake import FakeNvml, ScenarioError

        try:
            return FakeNvml(cfg.fake_scenario)
        except ScenarioError as exc:
            raise NvmlUnavailable(f"fake NVML scenario: {exc}") from exc
    from nvdaemon.nvml.real import RealNvml

    return RealNvml()


@dataclass(frozen=True)
class GpuStart:
    """What ``open_gpu`` found: the runtime (None without the gpu tier or without NVML), and the tiers to skip."""

    runtime: GpuRuntime | None
    skipped_tiers: frozenset[str] = frozenset()  # {"gpu"} when NVML is unusable and other tiers run


async def open_gpu(
    cfg: GpuConfig,
    tiers: Collection[str],
    *,
    node: str,
    emit: Callable[[list[Event]], None],
    next_seq: Callable[[], int],
    backend: NvmlBackend | None = None,
    lost: dict[str, Event] | None = None,
    ledger: XidLedger | None = None,
) -> GpuStart:
    """Open NVML when ``tiers`` (those that would run) include gpu; see the module docstring for when it cannot be.

    ``emit`` publishes XID and gpu_lost events; ``next_seq`` draws their sequence number from the engine's, so XIDs
    and rule events share one ordering. ``lost``: the engine state's ``lost_gpus`` (kept up to date, by ENTER id).
    """
    if "gpu" not in tiers:
        return GpuStart(None)

    def start() -> tuple[NvmlBackend, list[GpuIdentity], str]:  # reads the scenario or imports pynvml: off the loop
        chosen = backend or _backend_for(cfg)
        return chosen, chosen.open(), bounded_text(chosen.driver_version())  # a label on every dcgm series

    try:
        opened, identities, driver = await trio.to_thread.run_sync(start)
    except NvmlUnavailable as exc:
        if not [t for t in tiers if t != "gpu"]:
            raise
        log.warning("skipping gpu tier: %s", exc)
        return GpuStart(None, frozenset({"gpu"}))
    rt = GpuRuntime(
        opened, identities, node=node, driver_version=driver, emit=emit, next_seq=next_seq, lost=lost, ledger=ledger
    )
    log.info("gpu: %d GPU(s), driver %s", len(identities), driver or "unknown")
    return GpuStart(rt)


async def close_gpu(rt: GpuRuntime | None) -> None:
    """nvmlShutdown once no NVML call is in flight (an abandoned snapshot thread is waited for, briefly)."""
    if rt is None:
        return
    with bounded_shield(CLOSE_WAIT_SECONDS):
        # Holding every token of the NVML limiter = no NVML thread is running (abandoned ones included).
        for _ in range(int(rt.limiter.total_tokens)):
            await rt.limiter.acquire_on_behalf_of(object())
        await trio.to_thread.run_sync(rt.backend.close)


__all__ = ["GpuRuntime", "GpuStart", "close_gpu", "open_gpu"]
