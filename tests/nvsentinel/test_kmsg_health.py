"""Kernel-log conditions as NVSentinel HealthEvents (``map.kmsg_health``), and the kernel log's recovery signal
clearing an XID before any reboot: conditions made by the kernel-log source's own code (``kmsg/faults.py``,
``gpu/xid_ledger.py``), sent to the real gRPC platform-connector stand-in on a Unix socket."""

from __future__ import annotations

import trio

from nvdaemon.config import KernelRule, RuleNvsentinel
from nvdaemon.engine import EngineState
from nvdaemon.gpu.xid_ledger import XidLedger
from nvdaemon.kmsg import faults, rules
from nvdaemon.kmsg.faults import KernelFaults
from nvdaemon.kmsg.gpu_lines import parse_gpu_line
from nvdaemon.kmsg.rules import compile_rule
from nvdaemon.model import Event
from nvdaemon.sinks.nvsentinel import map as nvsentinel_map
from nvdaemon.sinks.nvsentinel.map import Entity, kmsg_health
from tests.nvsentinel.conftest import MakeReconciler
from tests.nvsentinel.connector import FakeConnector

SXID_LINE = "nvidia-nvswitch2: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error"
NONFATAL_SXID = "nvidia-nvswitch2: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX Short Error Rate"


def test_the_sink_names_the_kernel_logs_conditions_as_the_source_does() -> None:
    assert nvsentinel_map.KMSG_KEY_PREFIX == rules.KEY_PREFIX
    assert (nvsentinel_map.SXID_CONDITION, nvsentinel_map.FALLEN_CONDITION) == (
        faults.SXID_CONDITION,
        faults.FALLEN_CONDITION,
    )


def sxid_condition(line: str) -> EngineState:
    state = EngineState()
    parsed = parse_gpu_line(line)
    assert parsed is not None
    KernelFaults("n").on_sxid(state, parsed, line, 1.0)
    return state


def test_a_fatal_sxid_is_nvsentinels_sxid_fault_under_our_check_name() -> None:
    (cond,) = sxid_condition(SXID_LINE).active.values()
    h = kmsg_health(cond, strategy="EXECUTE_REMEDIATION")
    assert (h.check_name, h.component_class, h.error_code) == ("NvdaemonNvswitchSxidError", "GPU", ("24007",))
    assert (h.is_fatal, h.recommended_action) == (True, "CONTACT_SUPPORT")
    assert h.entities == (Entity("NVSWITCH", "2"),)


def test_a_non_fatal_sxid_asks_for_nothing() -> None:
    (cond,) = sxid_condition(NONFATAL_SXID).active.values()
    h = kmsg_health(cond)
    assert (h.is_fatal, h.recommended_action, h.error_code) == (False, "NONE", ("20009",))


def test_a_gpu_fallen_off_without_nvml_is_the_fallen_off_check_by_pci_address() -> None:
    state = EngineState()
    KernelFaults("n").on_fallen_off(state, "0000:3b:00.0", "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", 1.0)
    (cond,) = state.active.values()
    h = kmsg_health(cond)
    assert (h.check_name, h.error_code, h.recommended_action, h.is_fatal) == (
        "NvdaemonGpuFallenOff",
        ("GPU_FALLEN_OFF_BUS",),
        "RESTART_BM",
        True,
    )
    assert h.entities == (Entity("PCI", "0000:3b:00.0"),)


def test_a_kernel_rule_condition_takes_its_class_from_the_name_and_its_overrides_from_the_rule() -> None:
    rule = KernelRule(
        pattern=r"nvme (?P<dev>nvme\d+): controller is down",
        condition="nvme_controller_down",
        severity="critical",
        mode="condition",
        device="dev",
    )
    cr = compile_rule(rule)
    state = EngineState()
    line = "nvme nvme1: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff"
    KernelFaults("n").on_rule(state, cr, "nvme1", {"dev": "nvme1"}, line, 1.0)
    (cond,) = state.active.values()
    h = kmsg_health(cond)
    assert (h.check_name, h.component_class, h.entities) == (
        "NvdaemonNvmeControllerDown",
        "Disk",
        (Entity("DISK", "nvme1"),),
    )
    assert (h.is_fatal, h.recommended_action) == (True, "CONTACT_SUPPORT")
    overridden = kmsg_health(cond, overrides=RuleNvsentinel(check_name="NvmeDown", recommended_action="RESTART_BM"))
    assert (overridden.check_name, overridden.recommended_action, overridden.component_class) == (
        "NvmeDown",
        "RESTART_BM",
        "Disk",
    )


async def test_sxid_condition_reaches_the_connector_and_a_recovery_clears_an_xid(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    state = sxid_condition(SXID_LINE)
    # An XID from the kernel log (a GPU NVML does not know: named by its bus id), then its recovery signal.
    events: list[Event] = []
    seq = iter(range(1, 100))
    ledger = XidLedger(node="node-a", emit=events.extend, next_seq=lambda: next(seq))
    ledger.report("kmsg", 79, 1.0, pci="0000:3b:00", message="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off")
    for ev in events:
        rec.note_event(ev)
    await rec.reconcile(rec.desired(state.active.values(), {}), [])
    assert connector.condition("NvdaemonNvswitchSxidError") is not None
    (xid_fault,) = [e for e in connector.ok_events() if e.checkName == "NvdaemonGpuXidError"]
    assert not xid_fault.isHealthy and list(xid_fault.errorCode) == ["79"]
    recovered = ledger.recover(2.0, pci="0000:3b:00", signal="gpu_initialised")
    assert [e.condition for e in recovered] == ["gpu_xid_recovered"]
    rec.note_event(recovered[0])
    await rec.reconcile(rec.desired(state.active.values(), {}), [])
    last = [e for e in connector.ok_events() if e.checkName == "NvdaemonGpuXidError"][-1]
    assert last.isHealthy and list(last.errorCode) == ["79"]  # cleared before any reboot
    sxid = [e for e in connector.ok_events() if e.checkName == "NvdaemonNvswitchSxidError"]
    assert [e.isHealthy for e in sxid] == [False]  # still held: an SXID clears on a reboot only
