"""What kernel-log matches become: events and conditions. Pure: no I/O, no trio; time passed in.

- an ``event`` rule: one ENTER-only event per match (like an XID), on tier ``kernel``. Matches of one (rule, device)
  within the rule's ``windowSeconds`` of the last event are folded: counted, and reported as ``detail.repeats`` on
  the next event. A storm of 4,500 OOM lines a minute is one event a window, not 4,500.
- a ``condition`` rule: an engine condition (``EngineState.active``, so ``/v1/conditions``, ``engine.json`` and the
  NVSentinel sink see it as they see a threshold rule's), ENTERed after ``count`` matches within ``windowSeconds``,
  EXITed after ``clearAfterSeconds`` without one (``due``).
- an NVSwitch SXID: condition ``nvswitch_sxid_error`` per (switch, SXID), until a reboot (NVSentinel's syslog monitor
  holds them as long).
- a GPU fallen off the bus, where no NVML in this process can own it as ``gpu_lost``: condition ``gpu_fallen_off``
  per PCI address, until the driver brings that GPU up again (``recovered``) or a reboot.

A reboot (``reboot``) EXITs every kernel-log condition with ``detail.reason`` ``reboot``: their evidence was the
last boot's log, and what they report (a read-only remount, a fallen-off GPU, a hung task, a latched SXID) does not
survive a reboot; NVSentinel's syslog monitor and GPUd clear their XID state on a new boot id the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nvdaemon.engine import ActiveCondition, EngineState, SeriesKey, draw_seq, transition_event
from nvdaemon.kmsg.gpu_lines import GpuLine
from nvdaemon.kmsg.rules import FALLEN_CONDITION as FALLEN_CONDITION  # noqa: PLC0414 (re-export)
from nvdaemon.kmsg.rules import KEY_PREFIX, CompiledKernelRule
from nvdaemon.kmsg.rules import SXID_CONDITION as SXID_CONDITION  # noqa: PLC0414 (re-export)
from nvdaemon.model import Event, Phase, new_event_id

TIER = "kernel"
METRIC = "kmsg"
SXID_KEY = KEY_PREFIX + "sxid"
FALLEN_KEY = KEY_PREFIX + "gpu_fallen_off"
BUILTIN_KEYS = (SXID_KEY, FALLEN_KEY)
MESSAGE_MAX = 512  # characters of the kernel's line kept in an event's detail
GROUP_MAX = 128  # characters of a named group's text kept


@dataclass
class RuleMemory:
    """Per (rule, device): recent match times (condition mode) or the last event and the matches folded since."""

    hits: list[float] = field(default_factory=list)
    last_event: float = -math.inf
    folded: int = 0


class KernelFaults:
    def __init__(self, node: str, new_id: Callable[[float], str] = new_event_id) -> None:
        self.node = node
        self.new_id = new_id
        self.memory: dict[tuple[str, str], RuleMemory] = {}

    # ---- host rules ----------------------------------------------------------------------------------------------
    def on_rule(
        self,
        state: EngineState,
        cr: CompiledKernelRule,
        device: str,
        groups: Mapping[str, str | None],
        message: str,
        now: float,
    ) -> list[Event]:
        rule = cr.rule
        mem = self.memory.setdefault((cr.key, device), RuleMemory())
        found = {k: v[:GROUP_MAX] for k, v in groups.items() if v is not None}
        if rule.mode == "event":
            if now - mem.last_event < rule.window_seconds:
                mem.folded += 1
                return []
            repeats, mem.folded, mem.last_event = mem.folded, 0, now
            detail: dict[str, object] = {"message": message[:MESSAGE_MAX], "repeats": repeats, **found}
            return [
                Event(
                    id=self.new_id(now),
                    node=self.node,
                    tier=TIER,
                    device=device,
                    condition=rule.condition,
                    phase=Phase.ENTER,
                    severity=rule.severity,
                    seq=draw_seq(state),
                    started_at=now,
                    detail=detail,
                )
            ]
        mem.hits = [t for t in mem.hits if now - t < rule.window_seconds][-(rule.count - 1) :] if rule.count > 1 else []
        mem.hits.append(now)
        key: SeriesKey = (cr.key, METRIC, device, ())
        active = state.active.get(key)
        if active is not None:
            active.value, active.last_seen, active.stale = len(mem.hits), now, False
            return []
        if len(mem.hits) < rule.count:
            return []
        return [self._enter(state, key, rule.condition, rule.severity, device, float(rule.count), now, message, found)]

    # ---- GPU lines that are conditions -----------------------------------------------------------------------------
    def on_sxid(self, state: EngineState, line: GpuLine, message: str, now: float) -> list[Event]:
        device = f"nvswitch{line.switch}"
        key: SeriesKey = (SXID_KEY, METRIC, device, (("sxid", str(line.code)),))
        active = state.active.get(key)
        if active is not None:
            active.value += 1
            active.last_seen = now
            return []
        extra = {"sxid": str(line.code), "pci_bus_id": line.pci, "fatal": str(line.fatal).lower()}
        extra.update({("description" if k == "message" else k): v for k, v in line.detail.items()})
        severity = "critical" if line.fatal else "warning"
        return [self._enter(state, key, SXID_CONDITION, severity, device, 0.0, now, message, extra, value=1.0)]

    def on_fallen_off(self, state: EngineState, pci: str, message: str, now: float) -> list[Event]:
        key: SeriesKey = (FALLEN_KEY, METRIC, pci, ())
        if key in state.active:
            state.active[key].last_seen = now
            return []
        extra = {"pci_bus_id": pci}
        return [self._enter(state, key, FALLEN_CONDITION, "critical", pci, 0.0, now, message, extra, value=1.0)]

    def on_gpu_up(self, state: EngineState, pci_key: Callable[[str], str], pci: str, now: float) -> list[Event]:
        """The driver brought the GPU at ``pci`` up: its ``gpu_fallen_off`` EXITs."""
        want = pci_key(pci)
        keys = [k for k in state.active if k[0] == FALLEN_KEY and pci_key(k[2]) == want]
        return [self._exit(state, k, now, "gpu_initialised") for k in keys]

    # ---- time and reboots ----------------------------------------------------------------------------------------
    def due(self, state: EngineState, rules: Mapping[str, CompiledKernelRule], now: float) -> list[Event]:
        """EXIT the condition-rule conditions quiet for their ``clearAfterSeconds``; forget idle memory."""
        events = []
        for key in [k for k, c in state.active.items() if k[0] in rules]:
            cond = state.active[key]
            if now - cond.last_seen >= rules[key[0]].rule.clear_after_seconds:
                events.append(self._exit(state, key, now, "quiet"))
        for mk in [mk for mk, m in self.memory.items() if mk[0] not in rules or _idle(m, rules[mk[0]], now)]:
            del self.memory[mk]
        return events

    @staticmethod
    def next_deadline(state: EngineState, rules: Mapping[str, CompiledKernelRule]) -> float | None:
        times = [c.last_seen + rules[k[0]].rule.clear_after_seconds for k, c in state.active.items() if k[0] in rules]
        return min(times, default=None)

    def reboot(self, state: EngineState, now: float) -> list[Event]:
        """A new boot: every kernel-log condition EXITs (reason ``reboot``)."""
        self.memory.clear()
        return [self._exit(state, k, now, "reboot") for k in [k for k in state.active if k[0].startswith(KEY_PREFIX)]]

    # ---- transitions -----------------------------------------------------------------------------------------------
    def _enter(
        self,
        state: EngineState,
        key: SeriesKey,
        condition: str,
        severity: str,
        device: str,
        threshold: float,
        now: float,
        message: str,
        extra: Mapping[str, str],
        value: float | None = None,
    ) -> Event:
        cond = ActiveCondition(
            rule_key=key[0],
            metric=METRIC,
            device=device,
            labels=key[3],
            condition=condition,
            severity=severity,
            tier=TIER,
            threshold=threshold,
            started_at=now,
            enter_id="",
            value=threshold if value is None else value,
            last_seen=now,
        )
        ev = transition_event(
            state, cond, Phase.ENTER, self.node, now, self.new_id, message=message[:MESSAGE_MAX], **extra
        )
        cond.enter_id = ev.id
        state.active[key] = cond
        return ev

    def _exit(self, state: EngineState, key: SeriesKey, now: float, reason: str) -> Event:
        cond = state.active.pop(key)
        return transition_event(state, cond, Phase.EXIT, self.node, now, self.new_id, reason=reason)


def _idle(mem: RuleMemory, cr: CompiledKernelRule, now: float) -> bool:
    last = max(mem.hits[-1] if mem.hits else -math.inf, mem.last_event)
    return now - last >= cr.rule.window_seconds and mem.folded == 0
