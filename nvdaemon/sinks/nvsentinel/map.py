"""Our conditions and XIDs as NVSentinel HealthEvents, and the reconciler's plan. Pure: no I/O, no trio, no protobuf.

The unit the reconciler tracks is a ``Health``: one unhealthy (checkName, entities, errorCode) with the fields the
platform-connector acts on. *Desired* health comes from the engine's active conditions, the XIDs raised since boot
and the GPUs lost; *reported* health is what the platform-connector acknowledged. ``plan`` turns the two into the
events to send.

Defaults for a rule (each overridable in the rule's ``nvsentinel:`` block):

- checkName ``Nvdaemon`` + the condition in CamelCase (``load_high`` -> ``NvdaemonLoadHigh``);
- componentClass from the tier, metric and device (GPU, Disk, NIC, Memory, CPU, else Node);
- isFatal when the severity is critical; recommendedAction CONTACT_SUPPORT when fatal, NONE otherwise;
- entitiesImpacted from the device: a GPU its index, GPU_UUID and PCI (from labels); a disk DISK; a NIC NIC; a PCI
  address PCI. Node-wide checks (load, memory, a CPU sensor) have no entity: several series of one rule then share
  one Health, unhealthy while any of them is active, cleared (with no entities) when the last one clears;
- errorCode ``[condition]``; processingStrategy from the sink config (EXECUTE_REMEDIATION, or STORE_ONLY for an
  observe-only rollout).

XIDs: checkName ``NvdaemonGpuXidError``, componentClass GPU, errorCode ``[<xid>]``, entities PCI and GPU_UUID, the
action from ``XID_CATALOGUE`` (``nvdaemon/gpu/xid_catalogue.py``: NVIDIA's XID catalogue, each entry with its
source; ``sinks.nvsentinel.xidActions`` overrides), fatal exactly when the action is not NONE.

A lost GPU (the gpu tier's ``gpu_lost``: NVML answers GPU_IS_LOST, or the whole library stopped answering):
checkName ``NvdaemonGpuFallenOff``, errorCode ``[GPU_FALLEN_OFF_BUS]``, componentClass GPU, entities GPU (index),
GPU_UUID and PCI from the last identity known, fatal, RESTART_BM. The names follow NVSentinel's syslog monitor
(``health-monitors/syslog-health-monitor/pkg/gpufallen/gpufallen_handler.go``: check ``SysLogsGPUFallenOff``, errorCode
``GPU_FALLEN_OFF_BUS``, fatal, RESTART_BM) with our check prefix; its GPU health monitor says the same action for
DCGM's ``DCGM_FR_FALLEN_OFF_BUS`` (``charts/gpu-health-monitor/files/dcgmerrorsmapping.csv``). We do not borrow the
DCGM code: NVML, not a DCGM health watch, told us; nor the syslog monitor's check name: a condition shared between
two monitors would be cleared by the other one's healthy events.

A clear is a healthy event with the entities, errorCode, componentClass and processingStrategy of the fault it
clears (taken from what was reported, so a config change between the two cannot split them), isFatal false and
recommendedAction NONE, as NVSentinel's own monitors send it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal

import msgspec

from nvdaemon.config import RuleNvsentinel
from nvdaemon.engine import ActiveCondition
from nvdaemon.gpu import xid_catalogue
from nvdaemon.gpu.events import LOST_CONDITION as LOST_CONDITION  # noqa: PLC0414 (re-export: the reconciler's)
from nvdaemon.gpu.events import XID_CONDITION as XID_CONDITION  # noqa: PLC0414 (re-export: the reconciler's)
from nvdaemon.gpu.events import is_lost_gpu

XID_CHECK = "NvdaemonGpuXidError"
LOST_CHECK = "NvdaemonGpuFallenOff"
LOST_ERROR_CODE = "GPU_FALLEN_OFF_BUS"
LOST_ACTION = "RESTART_BM"
CHECK_PREFIX = "Nvdaemon"
DEFAULT_STRATEGY = "EXECUTE_REMEDIATION"

RECOMMENDED_ACTIONS: dict[str, int] = {
    "NONE": 0,
    "COMPONENT_RESET": 2,
    "CONTACT_SUPPORT": 5,
    "RUN_FIELDDIAG": 6,
    "RESTART_VM": 15,
    "RESTART_BM": 24,
    "REPLACE_VM": 25,
    "RUN_DCGMEUD": 26,
    "CUSTOM": 27,
    "UNKNOWN": 99,
}
PROCESSING_STRATEGIES: dict[str, int] = {
    "UNSPECIFIED": 0,
    "EXECUTE_REMEDIATION": 1,
    "STORE_ONLY": 2,
    "STORE_AND_ANALYSE": 3,
}

_PCI = re.compile(r"^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_CPU_CHIPS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu")
_HWMON = ("temp_", "fan_", "voltage_", "power_watts", "current_")


class Entity(msgspec.Struct, frozen=True, order=True):
    type: str
    value: str


Key = tuple[str, tuple[Entity, ...], tuple[str, ...]]
"""(checkName, entities, errorCode): what NVSentinel dedups and clears on."""


class Health(msgspec.Struct, frozen=True):
    """One unhealthy (checkName, entities, errorCode), desired or reported."""

    check_name: str
    component_class: str
    is_fatal: bool
    recommended_action: str
    error_code: tuple[str, ...]
    entities: tuple[Entity, ...]
    processing_strategy: str
    message: str = ""
    custom_recommended_action: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.check_name, self.entities, self.error_code)

    def material(self) -> tuple[object, ...]:
        """What a change of is worth re-sending for; the message (the current value) is not."""
        return (
            self.component_class,
            self.is_fatal,
            self.recommended_action,
            self.custom_recommended_action,
            self.processing_strategy,
        )


class HealthEventSpec(msgspec.Struct, frozen=True):
    """A HealthEvent to send, minus what is stamped per send (generatedTimestamp, id)."""

    agent: str
    node_name: str
    check_name: str
    component_class: str
    is_fatal: bool
    is_healthy: bool
    message: str
    recommended_action: str
    error_code: tuple[str, ...]
    entities: tuple[Entity, ...]
    processing_strategy: str
    custom_recommended_action: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)


class Change(msgspec.Struct, frozen=True):
    """One difference between desired and reported: what to send and what *reported* becomes once acknowledged."""

    kind: Literal["baseline", "raise", "clear"]
    key: Key
    event: HealthEventSpec
    health: Health | None  # the new reported entry for "raise"; None for "clear" and "baseline"


class XidRecord(msgspec.Struct, frozen=True):
    """An XID seen since boot; it stays desired-unhealthy until a reboot."""

    xid: int
    device: str
    pci: str = ""
    uuid: str = ""
    description: str = ""
    at: float = 0.0
    pods: str = ""  # pods_text() of the event's detail.pods (GPU pod attribution)


class LostGpu(msgspec.Struct, frozen=True):
    """A GPU that stopped answering; it stays desired-unhealthy until that GPU answers again (``answers``)."""

    device: str  # gpu<index>, as the gpu tier names it
    pci: str = ""
    uuid: str = ""
    error: str = ""  # NVML's answer, for the message
    at: float = 0.0
    pods: str = ""  # pods_text() of the ENTER's detail.pods (GPU pod attribution)

    def answers(self, device: str, uuid: str, pci: str) -> bool:
        """Is a GPU that answered with this identity this lost GPU? (``gpu.events.is_lost_gpu``: the gpu tier's
        rule for its EXIT.)"""
        return is_lost_gpu((self.device, self.uuid, self.pci), (device, uuid, pci))


# ---- names -------------------------------------------------------------------------------------------------------
def camel_case(name: str) -> str:
    """``load_high`` -> ``LoadHigh``: split on ``_``, first letter of each part upper-cased, the rest kept."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def default_check_name(condition: str) -> str:
    return CHECK_PREFIX + camel_case(condition)


def component_class(tier: str, metric: str, device: str) -> str:
    """CPU, Memory, Disk, NIC, GPU or Node, from what was measured on which device."""
    if tier == "gpu" or metric.startswith("gpu_"):
        return "GPU"
    if tier == "smart" or metric.startswith(("disk_", "smart_", "nvme_")):
        return "Disk"
    if metric.startswith("net_"):
        return "NIC"
    if metric.startswith(("mem_", "swap_")):
        return "Memory"
    if metric.startswith(("cpu_", "cpus_", "load", "procs_")):
        return "CPU"
    if metric.startswith("psi_"):
        return {"cpu": "CPU", "memory": "Memory"}.get(device, "Node")
    if metric.startswith("power_energy"):
        if device.startswith("package"):
            return "CPU"
        return "Memory" if device.startswith("dram") else "Node"
    if metric.startswith(_HWMON):
        parts = device.split("/")
        chip = parts[1] if len(parts) == 3 else device  # hwmon devices are hwmonN/<name file>/<sensor>
        if chip.startswith(_CPU_CHIPS):
            return "CPU"
        return "Disk" if chip.startswith("nvme") else "Node"
    return "Node"


def is_pci_address(device: str) -> bool:
    return bool(_PCI.match(device))


def entities_for(component: str, device: str, labels: Mapping[str, str]) -> tuple[Entity, ...]:
    """The entities NVSentinel keys on, from the device (and, for GPUs, the uuid/PCI labels)."""
    if component == "GPU":
        out: list[Entity] = []
        index = re.fullmatch(r"(?:gpu|nvidia)?(\d+)", device)
        if index:
            out.append(Entity("GPU", index.group(1)))
        uuid = labels.get("uuid") or labels.get("gpu_uuid")
        if uuid:
            out.append(Entity("GPU_UUID", uuid))
        pci = labels.get("pci_bus_id") or labels.get("pci") or (device if is_pci_address(device) else "")
        if pci:
            out.append(Entity("PCI", pci))
        if not out and device:
            out.append(Entity("GPU", device))
        return tuple(out)
    if is_pci_address(device):
        return (Entity("PCI", device),)
    if component == "Disk" and device:
        return (Entity("DISK", device),)
    if component == "NIC" and device:
        return (Entity("NIC", device),)
    return ()


# ---- GPU pod attribution in message text (the only place NVSentinel sees detail.pods) ----------------------------
def pods_text(pods: object) -> str:
    """`` (pods: ns/pod/container, ...)`` for an event's ``detail.pods``; "" when attribution gave none."""
    if not isinstance(pods, list) or not pods:
        return ""
    names = [f"{p.get('namespace')}/{p.get('pod')}/{p.get('container')}" for p in pods if isinstance(p, dict)]
    return f" (pods: {', '.join(names)})" if names else ""


# ---- desired health ------------------------------------------------------------------------------------------------
def _fmt(value: float) -> str:
    return f"{value:.6g}"


def condition_message(cond: ActiveCondition, op: str) -> str:
    labels = ",".join(f"{k}={v}" for k, v in cond.labels)
    series = f"{cond.metric}{{{labels}}}" if labels else cond.metric
    where = f" on {cond.device}" if cond.device else ""
    text = f"{cond.condition}: {series}{where} is {_fmt(cond.value)}, threshold {op} {_fmt(cond.threshold)}"
    return text + (" (device no longer reporting)" if cond.stale else "") + pods_text(cond.pods)


def rule_health(
    cond: ActiveCondition,
    *,
    op: str = ">",
    overrides: RuleNvsentinel | None = None,
    strategy: str = DEFAULT_STRATEGY,
) -> Health:
    """The unhealthy Health of one active rule condition."""
    o = overrides or RuleNvsentinel()
    component = o.component_class or component_class(cond.tier, cond.metric, cond.device)
    fatal = o.fatal if o.fatal is not None else cond.severity == "critical"
    action = o.recommended_action or ("CONTACT_SUPPORT" if fatal else "NONE")
    return Health(
        check_name=o.check_name or default_check_name(cond.condition),
        component_class=component,
        is_fatal=fatal,
        recommended_action=action,
        custom_recommended_action=o.custom_recommended_action if action == "CUSTOM" else "",
        error_code=(cond.condition,),
        entities=entities_for(component, cond.device, dict(cond.labels)),
        processing_strategy=o.processing_strategy or strategy,
        message=condition_message(cond, op),
        metadata={"condition": cond.condition, "severity": cond.severity, "tier": cond.tier, "device": cond.device},
    )


def xid_health(
    rec: XidRecord, *, overrides: Mapping[str, str] | None = None, strategy: str = DEFAULT_STRATEGY
) -> Health:
    action = xid_catalogue.xid_action(rec.xid, overrides)
    pci = rec.pci or (rec.device if is_pci_address(rec.device) else "")
    entities = [Entity("PCI", pci)] if pci else []
    if rec.uuid:
        entities.append(Entity("GPU_UUID", rec.uuid))
    if not entities:  # nothing better known: the GPU as the tier named it
        entities.append(Entity("GPU", rec.device))
    description = rec.description or xid_catalogue.xid_description(rec.xid)
    where = pci or rec.uuid or rec.device
    return Health(
        check_name=XID_CHECK,
        component_class="GPU",
        is_fatal=xid_catalogue.is_fatal(action),
        recommended_action=action,
        error_code=(str(rec.xid),),
        entities=tuple(entities),
        processing_strategy=strategy,
        message=f"XID {rec.xid} on GPU {where}: {description}{rec.pods}",
        metadata={"condition": XID_CONDITION, "xid": str(rec.xid), "device": rec.device},
    )


def lost_health(rec: LostGpu, *, strategy: str = DEFAULT_STRATEGY) -> Health:
    """The fatal RESTART_BM fault of a GPU that fell off the bus (see the module docstring for the names)."""
    entities = entities_for("GPU", rec.device, {"gpu_uuid": rec.uuid, "pci_bus_id": rec.pci})
    why = f": {rec.error}" if rec.error else ""  # the entities name the GPU; condition messages are capped
    return Health(
        check_name=LOST_CHECK,
        component_class="GPU",
        is_fatal=True,
        recommended_action=LOST_ACTION,
        error_code=(LOST_ERROR_CODE,),
        entities=entities,
        processing_strategy=strategy,
        message=f"{rec.device} fell off the bus{why}{rec.pods}",
        metadata={"condition": LOST_CONDITION, "device": rec.device},
    )


# The kernel-log source's condition key prefix and names (kmsg/rules.py, kmsg/faults.py; not imported: the kernel-log
# source sits above the sinks, and map.py stays pure data; tests/nvsentinel/test_kmsg_health.py holds them equal).
KMSG_KEY_PREFIX = "kmsg:"
SXID_CONDITION = "nvswitch_sxid_error"
FALLEN_CONDITION = "gpu_fallen_off"
_KMSG_COMPONENTS = (
    (("nvme_", "filesystem_", "block_io"), "Disk"),
    (("memory_read", "hardware_error_cper"), "Memory"),
    (("machine_check",), "CPU"),
)


def kmsg_health(
    cond: ActiveCondition, *, overrides: RuleNvsentinel | None = None, strategy: str = DEFAULT_STRATEGY
) -> Health:
    """A kernel-log condition (nvdaemon/kmsg/faults.py). An SXID as NVSentinel's syslog monitor sends one
    (``SysLogsSXIDError``: errorCode the SXID, entities NVSWITCH, PCI and NVLINK, fatal as the line says, then
    CONTACT_SUPPORT) under ``NvdaemonNvswitchSxidError``; a GPU fallen off the bus that no NVML in this process knows
    as ``NvdaemonGpuFallenOff`` keyed by its PCI address; a ``kernelRules`` condition as a threshold rule's, with
    its ``nvsentinel`` overrides and a component class from its condition name."""
    labels = dict(cond.labels)
    if cond.condition == SXID_CONDITION:
        fatal = cond.severity == "critical"
        switch = cond.device.removeprefix("nvswitch")
        return Health(
            check_name=CHECK_PREFIX + "NvswitchSxidError",
            component_class="GPU",
            is_fatal=fatal,
            recommended_action="CONTACT_SUPPORT" if fatal else "NONE",
            error_code=(labels.get("sxid", ""),),
            entities=(Entity("NVSWITCH", switch),),
            processing_strategy=strategy,
            message=f"SXID {labels.get('sxid', '')} on {cond.device}",
            metadata={"condition": cond.condition, "device": cond.device},
        )
    if cond.condition == FALLEN_CONDITION:  # the device is the GPU's PCI address
        lost = lost_health(LostGpu(cond.device, pci=cond.device, error="kernel log"), strategy=strategy)
        return msgspec.structs.replace(lost, metadata={"condition": cond.condition, "device": cond.device})
    component = next((c for prefixes, c in _KMSG_COMPONENTS if cond.condition.startswith(prefixes)), "Node")
    o = overrides or RuleNvsentinel()
    if not o.component_class:
        o = msgspec.structs.replace(o, component_class=component)
    return rule_health(cond, op=">=", overrides=o, strategy=strategy)


def _rank(h: Health) -> tuple[bool, bool]:
    return (h.is_fatal, h.recommended_action != "NONE")


def merge(healths: Iterable[Health]) -> dict[Key, Health]:
    """Group by key; several series on one key: fatal wins, then the stronger action; messages joined."""
    out: dict[Key, Health] = {}
    for h in healths:
        prev = out.get(h.key)
        if prev is None:
            out[h.key] = h
            continue
        first, second = (h, prev) if _rank(h) > _rank(prev) else (prev, h)
        message = first.message if second.message in first.message else f"{first.message}, {second.message}"
        out[h.key] = msgspec.structs.replace(first, message=message)
    return out


# ---- events and plan ---------------------------------------------------------------------------------------------
def unhealthy_event(h: Health, *, agent: str, node: str) -> HealthEventSpec:
    return HealthEventSpec(
        agent=agent,
        node_name=node,
        check_name=h.check_name,
        component_class=h.component_class,
        is_fatal=h.is_fatal,
        is_healthy=False,
        message=h.message,
        recommended_action=h.recommended_action,
        custom_recommended_action=h.custom_recommended_action,
        error_code=h.error_code,
        entities=h.entities,
        processing_strategy=h.processing_strategy,
        metadata=dict(h.metadata),
    )


def healthy_event(h: Health, *, agent: str, node: str) -> HealthEventSpec:
    """The clear of a reported fault: same check, entities, errorCode, componentClass and processingStrategy."""
    what = ", ".join(f"{e.type} {e.value}" for e in h.entities) or "node"
    return HealthEventSpec(
        agent=agent,
        node_name=node,
        check_name=h.check_name,
        component_class=h.component_class,
        is_fatal=False,
        is_healthy=True,
        message=f"{'/'.join(h.error_code)} on {what} recovered",
        recommended_action="NONE",
        error_code=h.error_code,
        entities=h.entities,
        processing_strategy=h.processing_strategy,
        metadata=dict(h.metadata),
    )


def baseline_event(check: str, component: str, strategy: str, *, agent: str, node: str) -> HealthEventSpec:
    """A healthy event with no entities: clears whatever a previous install left on the node for this check."""
    return HealthEventSpec(
        agent=agent,
        node_name=node,
        check_name=check,
        component_class=component,
        is_fatal=False,
        is_healthy=True,
        message=f"{check}: no health failures (agent started)",
        recommended_action="NONE",
        error_code=(),
        entities=(),
        processing_strategy=strategy,
    )


class CheckSpec(msgspec.Struct, frozen=True):
    """A configured check, for its healthy baseline."""

    check_name: str
    component_class: str
    processing_strategy: str


def plan(
    desired: Mapping[Key, Health],
    reported: Mapping[Key, Health],
    *,
    checks: Iterable[CheckSpec] = (),
    baselined: Iterable[str] = (),
    agent: str,
    node: str,
) -> list[Change]:
    """The events that bring *reported* to *desired*: baselines first (a baseline clears the whole check, so it
    must never follow a raise), then clears, then raises, each group in key order."""
    done = set(baselined)
    changes: list[Change] = []
    for spec in sorted({c.check_name: c for c in checks}.values(), key=lambda c: c.check_name):
        if spec.check_name not in done:
            ev = baseline_event(spec.check_name, spec.component_class, spec.processing_strategy, agent=agent, node=node)
            changes.append(Change("baseline", (spec.check_name, (), ()), ev, None))
    for key in sorted(k for k in reported if k not in desired):
        changes.append(Change("clear", key, healthy_event(reported[key], agent=agent, node=node), None))
    for key in sorted(desired):
        want, have = desired[key], reported.get(key)
        if have is None or have.material() != want.material():
            changes.append(Change("raise", key, unhealthy_event(want, agent=agent, node=node), want))
    return changes


def rule_check(
    condition: str, tier: str, metric: str, device: str, overrides: RuleNvsentinel | None, strategy: str
) -> CheckSpec:
    o = overrides or RuleNvsentinel()
    return CheckSpec(
        check_name=o.check_name or default_check_name(condition),
        component_class=o.component_class or component_class(tier, metric, device),
        processing_strategy=o.processing_strategy or strategy,
    )


def xid_check(strategy: str) -> CheckSpec:
    return CheckSpec(XID_CHECK, "GPU", strategy)


def lost_check(strategy: str) -> CheckSpec:
    return CheckSpec(LOST_CHECK, "GPU", strategy)
