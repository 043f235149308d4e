"""NVSentinel's reconciler: keeps the platform-connector's view of this node equal to ours (DESIGN §7, §8).

*Desired* health per (checkName, entities, errorCode) comes from the engine's active conditions, the XIDs raised
since boot and the GPUs lost (``map``); *reported* health is what the platform-connector acknowledged,
persisted in ``stateDir/nvsentinel.json`` (``state``). Each difference is published, one HealthEvent per
call (``wire``), and *reported* advances (and is written) only after the call returned OK.

- A missing socket, or a file at its path that is not a socket, skips the send (counted), no retry, nothing
  advanced; the next tick sends again with a fresh ``generatedTimestamp``. Such a streak is logged once when it
  starts (with what its first pass skipped; ERROR when that includes a fatal fault, else WARNING) and once when the
  socket is back (INFO, with how long and how many sends were skipped), not per send; its state is in the status
  (``socketState``, ``lastError``).
- Retries (``maxAttempts``, ``retryInitialSeconds`` x ``retryMultiplier``, +-``retryJitter``) only on what
  ``classify`` calls retryable; any other answer is a rejection: counted, not retried now, tried again on a later
  tick (the difference is still there). Later ticks back off (``hold``): a difference rejected twice in a
  row, or every send once a pass spent its retries, waits a growing delay (at most a minute) before it is sent again.
- Healthy baseline: the first time a configured check is seen, a healthy event with no entities clears whatever an
  earlier install left on the node for it.
- XIDs clear only on a reboot: when the boot id differs from the one in the state file, the XIDs raised before it
  are dropped from *desired*, so a healthy event goes out for each.
- A lost GPU (``gpu_lost`` ENTER, from the bus or, every tick, from the gpu tier's list of GPUs lost now, so one
  lost before the sink subscribed is not missed) stays desired-unhealthy, persisted, until that GPU answers again:
  its ``gpu_lost`` EXIT, or, after a restart of the agent (which forgets which GPUs its gpu tier saw lost), the gpu
  tier's list of GPUs whose last snapshot succeeded (``gpus_answering``). A reboot alone does not clear it.

Sends run through ``trio.to_thread.run_sync`` with a CapacityLimiter(1) of the reconciler's own.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import trio

from nvdaemon.backoff import backoff, plus_minus
from nvdaemon.config import NvsentinelSink, Rule, RuleNvsentinel
from nvdaemon.engine import ActiveCondition
from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, Metric
from nvdaemon.gpu.xid_ledger import RECOVERED_CONDITION, pci_key
from nvdaemon.model import Event, Phase, new_event_id
from nvdaemon.sinks.nvsentinel.hold import Holds
from nvdaemon.sinks.nvsentinel.map import (
    KMSG_KEY_PREFIX,
    LOST_CONDITION,
    XID_CONDITION,
    Change,
    CheckSpec,
    Health,
    Key,
    LostGpu,
    XidRecord,
    kmsg_health,
    lost_check,
    lost_health,
    merge,
    plan,
    rule_check,
    rule_health,
    xid_check,
    xid_health,
)
from nvdaemon.sinks.nvsentinel.socket import SocketMissing, SocketStreak, describe, fatal
from nvdaemon.sinks.nvsentinel.state import Persisted, lost_record, read_boot_id, xid_record
from nvdaemon.sinks.nvsentinel.wire import GrpcPublisher, Publisher, RpcError, SendError, TokenError, classify, to_proto
from nvdaemon.statefile import atomic_write, quarantine

log = logging.getLogger("nvdaemon.sinks.nvsentinel")  # the sink's logger: one name for all its lines


class Reconciler:
    """Desired vs reported, the sends and their counters. Touched only from the trio thread (sends in a worker)."""

    def __init__(
        self,
        settings: NvsentinelSink,
        *,
        node: str,
        state_path: Path,
        boot_id_path: Path | None,
        publisher: Publisher | None = None,
        jitter: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.node = node
        self.state_path = state_path
        self.boot_id_path = boot_id_path
        self.publisher: Publisher = publisher or GrpcPublisher(
            settings.socket_path, settings.token_path, settings.call_timeout_seconds
        )
        self.jitter = jitter
        self.clock = clock
        self.limiter = trio.CapacityLimiter(1)
        self.holds = Holds(self._delay, settings.max_attempts)
        self.reported: dict[Key, Health] = {}
        self.baselined: set[str] = set()
        self.xids: dict[tuple[int, str, str, str], XidRecord] = {}
        self.lost: dict[tuple[str, str, str], LostGpu] = {}
        self.boot_id = ""
        self.dirty = False
        self.state_error: str | None = None  # why the last state write failed (a full or read-only stateDir)
        # counters and status
        self.success = 0
        self.skipped = 0
        self.errors: collections.Counter[str] = collections.Counter()
        self.pending = 0
        self.socket = SocketStreak(settings.socket_path, log)
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.version = 0  # bumped whenever something /metrics or /v1/status shows changed
        self.reconciles = 0  # completed passes (/v1/status only: not a /metrics change, so no version bump)

    # ---- state -------------------------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the state file and the boot id (sync: call in a thread). A damaged file is moved aside."""
        state = Persisted()
        try:
            data = self.state_path.read_bytes()
        except FileNotFoundError:
            data = b""
        if data:
            try:
                state = msgspec.json.decode(data, type=Persisted)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                quarantine(self.state_path, str(exc))
        self.reported = {h.key: h for h in state.reported}
        self.baselined = set(state.baselined)
        self.xids = {self._xid_key(x): x for x in state.xids}
        self.lost = {self._lost_key(g): g for g in state.lost}
        self.boot_id = state.boot_id
        boot = read_boot_id(self.boot_id_path)
        if boot is None:
            log.warning("nvsentinel: boot id unreadable at %s; XIDs will not clear on reboot", self.boot_id_path)
            return
        if self.boot_id and boot != self.boot_id and self.xids:
            log.info("nvsentinel: boot id changed (reboot): clearing %d XID condition(s)", len(self.xids))
            self.xids.clear()
        if boot != self.boot_id:
            self.boot_id = boot
            self.dirty = True

    def dump(self) -> bytes:
        return msgspec.json.encode(
            Persisted(
                boot_id=self.boot_id,
                baselined=sorted(self.baselined),
                reported=[self.reported[k] for k in sorted(self.reported)],
                xids=sorted(self.xids.values(), key=self._xid_key),
                lost=[self.lost[k] for k in sorted(self.lost)],
            )
        )

    async def persist(self) -> None:
        """Save what NVSentinel was told. A stateDir that refuses the write (full, read-only) leaves the state dirty
        and in memory, saved again on the next reconcile: raising would restart the task from the older file and
        forget what NVSentinel acknowledged since (a condition it still holds that the agent no longer knows of)."""
        self.dirty = False
        try:
            await trio.to_thread.run_sync(atomic_write, self.state_path, self.dump())
        except OSError as exc:
            self.dirty = True
            if self.state_error is None:
                log.error(
                    "nvsentinel: state not saved (%s); kept in memory, saved again on the next tick", exc.strerror
                )
            self.state_error = exc.strerror or type(exc).__name__
            return
        self.state_error = None

    @staticmethod
    def _xid_key(x: XidRecord) -> tuple[int, str, str, str]:
        return (x.xid, x.device, x.pci, x.uuid)

    @staticmethod
    def _lost_key(g: LostGpu) -> tuple[str, str, str]:
        return (g.device, g.uuid, g.pci)

    def note_event(self, ev: Event) -> None:
        """XIDs are remembered until a reboot, lost GPUs until they answer; rule events need nothing (desired is read
        from the engine)."""
        if ev.condition == LOST_CONDITION:
            self._note_lost(ev)
            return
        if ev.condition == RECOVERED_CONDITION:
            self._note_recovered(ev)
            return
        if ev.condition != XID_CONDITION or ev.phase is not Phase.ENTER:
            return
        rec = xid_record(ev)
        if rec is None:
            log.warning("nvsentinel: XID event %s without a usable xid in its detail; ignored", ev.id)
            return
        key = self._xid_key(rec)
        if key not in self.xids:
            self.xids[key] = rec
            self.dirty = True

    def _note_recovered(self, ev: Event) -> None:
        """A recovery signal of the kernel log (gpu/xid_ledger.py): the XIDs it names on that GPU clear now, not
        only at the next reboot."""
        d = ev.detail
        pci, uuid = pci_key(str(d.get("pci_bus_id") or "")), str(d.get("gpu_uuid") or "")
        named = d.get("xids")
        xids = {x for x in named if isinstance(x, int)} if isinstance(named, list) else set()
        for key, rec in list(self.xids.items()):
            same_gpu = (pci and pci_key(rec.pci or rec.device) == pci) or (uuid and rec.uuid == uuid)
            if same_gpu and rec.xid in xids:
                del self.xids[key]
                self.dirty = True
                log.info("nvsentinel: XID %d on %s cleared (%s)", rec.xid, rec.pci or rec.device, d.get("signal"))

    def _note_lost(self, ev: Event) -> None:
        rec = lost_record(ev)
        if ev.phase is Phase.EXIT:
            self.gpus_answering([(rec.device, rec.uuid, rec.pci)])
            return
        if ev.phase is not Phase.ENTER:
            return
        # The same GPU seen lost again (after a restart): keep the record already reported. One without a uuid or
        # PCI address (NVML could not say) is the same GPU as a known record of that index.
        same = [g for g in self.lost.values() if g.device == rec.device and (not rec.uuid or g.uuid == rec.uuid)]
        if same:
            return
        self.lost[self._lost_key(rec)] = rec
        self.dirty = True
        log.warning("nvsentinel: %s (%s) lost: %s", rec.device, rec.uuid or rec.pci or "identity unknown", rec.error)

    def gpus_answering(self, answering: Iterable[tuple[str, str, str]]) -> None:
        """GPUs (device, uuid, PCI address) that answered NVML: the lost records they match are dropped, so the
        fault clears."""
        for device, uuid, pci in answering:
            for key, g in list(self.lost.items()):
                if g.answers(device, uuid, pci):
                    del self.lost[key]
                    self.dirty = True
                    log.info("nvsentinel: %s (%s) answers again", g.device, g.uuid or g.pci or device)

    # ---- desired -----------------------------------------------------------------------------------------------
    def desired(
        self,
        conditions: Iterable[ActiveCondition],
        rules: Mapping[str, Rule],
        kernel: Mapping[str, RuleNvsentinel | None] | None = None,
    ) -> dict[Key, Health]:
        """``kernel``: the kernel-log rules' NVSentinel overrides by condition key (``kmsg_health``)."""
        strategy = self.settings.processing_strategy
        healths: list[Health] = []
        for cond in conditions:
            if cond.condition == XID_CONDITION:
                continue
            if cond.rule_key.startswith(KMSG_KEY_PREFIX):
                kernel_overrides = (kernel or {}).get(cond.rule_key)
                healths.append(kmsg_health(cond, overrides=kernel_overrides, strategy=strategy))
                continue
            rule = rules.get(cond.rule_key)
            healths.append(
                rule_health(
                    cond,
                    op=rule.op if rule else ">",
                    overrides=rule.nvsentinel if rule else None,
                    strategy=strategy,
                )
            )
        overrides = self.settings.xid_actions
        healths += [xid_health(x, overrides=overrides, strategy=strategy) for x in self.xids.values()]
        healths += [lost_health(g, strategy=strategy) for g in self.lost.values()]
        return merge(healths)

    def checks(self, rules: Iterable[Rule], xid_enabled: bool, gpu_enabled: bool = False) -> list[CheckSpec]:
        strategy = self.settings.processing_strategy
        out = [rule_check(r.condition, "", r.metric, r.device, r.nvsentinel, strategy) for r in rules]
        if xid_enabled:
            out.append(xid_check(strategy))
        if gpu_enabled:
            out.append(lost_check(strategy))
        return out

    def plan(self, desired: Mapping[Key, Health], checks: Iterable[CheckSpec]) -> list[Change]:
        return plan(
            desired,
            self.reported,
            checks=checks if self.settings.healthy_baseline else (),
            baselined=self.baselined,
            agent=self.settings.agent,
            node=self.node,
        )

    # ---- sending -----------------------------------------------------------------------------------------------
    def _delay(self, attempt: int) -> float:
        s = self.settings  # no cap: maxAttempts bounds the retries
        jitter = plus_minus(s.retry_jitter)
        return backoff(attempt, s.retry_initial_seconds, math.inf, jitter, self.jitter(), s.retry_multiplier)

    def close(self) -> None:
        """The sink is replaced or stopped: the publisher's channel is closed (a call still in flight in an abandoned
        worker thread ends CANCELLED, its outcome unseen)."""
        close = getattr(self.publisher, "close", None)  # a test's stand-in publisher may have none
        if close is not None:
            close()

    def _failed(self, err: SendError | TokenError, change: Change) -> None:
        self.last_error = str(err)
        self.last_error_at = self.clock()
        self.version += 1
        log.warning("nvsentinel: %s %s not delivered: %s", change.kind, change.key[0], err)

    @property
    def socket_present(self) -> bool | None:
        return self.socket.present

    def _socket_usable(self) -> None:
        if self.socket.usable():
            self.version += 1  # a streak ended: socketState changed

    async def deliver(self, change: Change) -> str:
        """One difference: ``ok``, ``skipped`` (socket missing), ``rejected`` or ``unavailable`` (retries spent)."""
        request = to_proto(change.event, now=self.clock(), event_id=new_event_id())
        attempt = 0
        while True:
            attempt += 1
            try:
                await trio.to_thread.run_sync(
                    self.publisher.send, request, limiter=self.limiter, abandon_on_cancel=True
                )
            except SocketMissing as exc:
                self.skipped += 1
                self.last_error, self.last_error_at = str(exc), self.clock()
                self.version += 1
                self.socket.unusable(exc.state, describe(change), fatal(change))
                return "skipped"
            except TokenError as exc:
                self._socket_usable()
                self.errors["TOKEN_ERROR"] += 1
                self._failed(exc, change)
                return "rejected"
            except (RpcError, OSError) as exc:
                self._socket_usable()
                err = classify(exc)
                self.errors[err.code] += 1
                self._failed(err, change)
                if not err.retryable:
                    return "rejected"
                if attempt >= self.settings.max_attempts:
                    return "unavailable"
                await trio.sleep(self._delay(attempt))
                continue
            break
        self._socket_usable()
        self.success += 1
        self.version += 1
        if change.kind == "baseline":
            self.baselined.add(change.key[0])
        elif change.kind == "clear":
            self.reported.pop(change.key, None)
        elif change.health is not None:
            self.reported[change.key] = change.health
        await self.persist()
        log.info(
            "nvsentinel: %s %s %s acknowledged",
            change.kind,
            change.key[0],
            " ".join(f"{e.type}={e.value}" for e in change.key[1]) or "(node)",
        )
        return "ok"

    async def reconcile(self, desired: Mapping[Key, Health], checks: Iterable[CheckSpec]) -> None:
        """Publish every difference once; stop early when the platform-connector is gone or keeps failing."""
        checks = list(checks)
        if self.dirty:
            await self.persist()
        planned = [] if self.holds.all_held(trio.current_time()) else self.plan(desired, checks)
        with self.socket.one_pass():
            for change in planned:
                if self.holds.held(change, trio.current_time()):
                    continue  # rejected in a row: its delay is not over
                outcome = await self.deliver(change)
                self.holds.outcome(change, outcome, trio.current_time())
                if outcome == "unavailable":
                    break
        left = self.plan(desired, checks)
        self.holds.keep_only(left)
        pending = len(left)
        if not pending:
            release = getattr(self.publisher, "release", None)  # a test's stand-in publisher may have none
            if release is not None:
                release()  # nothing more to send: no idle channel (wire.GrpcPublisher.release)
        if pending != self.pending:
            self.pending = pending
            self.version += 1
        self.reconciles += 1

    # ---- views -------------------------------------------------------------------------------------------------
    def metrics(self) -> Iterator[Metric]:
        monitor = self.settings.agent
        skipped = CounterMetricFamily(
            "nvsentinel_health_events_publisher_skipped_pc_unavailable",
            "Health events not sent because the platform-connector socket was absent (or not a socket).",
            labels=["monitor"],
        )
        skipped.add_metric([monitor], self.skipped)
        success = CounterMetricFamily(
            "nvsentinel_health_events_publisher_sends_success",
            "Health events the platform-connector acknowledged.",
            labels=["monitor"],
        )
        success.add_metric([monitor], self.success)
        errors = CounterMetricFamily(
            "nvsentinel_health_events_publisher_sends_error",
            "Health event send attempts that failed, by gRPC status code (TOKEN_ERROR: token file unusable).",
            labels=["monitor", "code"],
        )
        for code, n in sorted(self.errors.items()):
            errors.add_metric([monitor, code], n)
        pending = GaugeMetricFamily(
            "nodevitals_nvsentinel_pending",
            "Differences between desired and reported NVSentinel health not yet acknowledged.",
            labels=["monitor"],
        )
        pending.add_metric([monitor], self.pending)
        yield from (skipped, success, errors, pending)

    def state(self) -> dict[str, Any]:
        return {
            "socketPath": self.settings.socket_path,
            "socketPresent": self.socket.present,
            "socketState": self.socket.state(),  # "present", "missing", "not a socket: <kind>"; None: not tried yet
            "tokenConfigured": bool(self.settings.token_path),
            "pending": self.pending,
            "reconciles": self.reconciles,
            "sent": self.success,
            "skipped": self.skipped,
            "errors": dict(sorted(self.errors.items())),
            "lastError": self.last_error,
            "lastErrorAt": self.last_error_at,
            "bootId": self.boot_id,
            "baselined": sorted(self.baselined),
            "reported": [
                {
                    "checkName": h.check_name,
                    "componentClass": h.component_class,
                    "entities": [{"type": e.type, "value": e.value} for e in h.entities],
                    "errorCode": list(h.error_code),
                    "isFatal": h.is_fatal,
                    "recommendedAction": h.recommended_action,
                    "processingStrategy": h.processing_strategy,
                }
                for _, h in sorted(self.reported.items())
            ],
            "xids": [msgspec.to_builtins(x) for x in self.xids.values()],
            "lostGpus": [msgspec.to_builtins(g) for g in self.lost.values()],
        }
