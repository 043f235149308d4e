"""The pure mapping: condition/XID -> HealthEvent fields, the XID table, names, and the reconciler's plan."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.config import RuleNvsentinel
from nvdaemon.engine import ActiveCondition
from nvdaemon.gpu.xid_catalogue import (
    ACTION_NAMES,
    UNSOURCED,
    XID_ACTIONS,
    XID_CATALOGUE,
    XID_DESCRIPTIONS,
    XID_SOURCES,
    bucket_action,
    xid_action,
)
from nvdaemon.sinks.nvsentinel.map import (
    RECOMMENDED_ACTIONS,
    CheckSpec,
    Entity,
    LostGpu,
    XidRecord,
    camel_case,
    component_class,
    default_check_name,
    entities_for,
    healthy_event,
    lost_health,
    merge,
    plan,
    rule_health,
    xid_health,
)


def cond(
    condition: str = "load_high",
    metric: str = "load1",
    device: str = "cpu",
    severity: str = "warning",
    tier: str = "core",
    labels: tuple[tuple[str, str], ...] = (),
    value: float = 24.51,
    threshold: float = 16.0,
) -> ActiveCondition:
    return ActiveCondition(
        rule_key="k",
        metric=metric,
        device=device,
        labels=labels,
        condition=condition,
        severity=severity,
        tier=tier,
        threshold=threshold,
        started_at=1.0,
        enter_id="e",
        value=value,
        last_seen=1.0,
    )


@pytest.mark.parametrize(
    ("condition", "check"),
    [
        ("load_high", "NvdaemonLoadHigh"),
        ("pcie_aer_fatal", "NvdaemonPcieAerFatal"),
        ("gpu_xid", "NvdaemonGpuXid"),
        ("memoryHot", "NvdaemonMemoryHot"),
        ("disk_2_slow", "NvdaemonDisk2Slow"),
    ],
)
def test_default_check_name(condition: str, check: str) -> None:
    assert default_check_name(condition) == check


@given(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]*", fullmatch=True))
def test_camel_case_keeps_the_letters_and_drops_underscores(name: str) -> None:
    out = camel_case(name)
    assert re.fullmatch(r"[A-Za-z0-9]*", out)
    assert out.lower() == name.replace("_", "").lower()
    for part in name.split("_"):
        if part:
            assert part[0].upper() + part[1:] in out
    if name[:1].isalpha():
        assert out[:1].isupper()


@pytest.mark.parametrize(
    ("tier", "metric", "device", "expected"),
    [
        ("core", "load1", "cpu", "CPU"),
        ("core", "cpu_util_pct", "cpu3", "CPU"),
        ("core", "mem_hardware_corrupted_bytes", "mem", "Memory"),
        ("core", "disk_io_time_seconds_total", "sda", "Disk"),
        ("smart", "smart_pending_sectors", "sda", "Disk"),
        ("core", "net_rx_errors_total", "eth0", "NIC"),
        ("gpu", "gpu_temperature_celsius", "gpu0", "GPU"),
        ("core", "temp_celsius", "hwmon0/coretemp/temp1", "CPU"),
        ("core", "temp_celsius", "hwmon1/nvme/temp1", "Disk"),
        ("core", "temp_celsius", "hwmon3/acpitz/temp1", "Node"),
        ("core", "psi_stall_ratio_avg10", "memory", "Memory"),
        ("core", "psi_stall_ratio_avg10", "cpu", "CPU"),
        ("core", "psi_stall_ratio_avg10", "io", "Node"),
        ("core", "pcie_aer_fatal_total", "0000:3b:00.0", "Node"),
        ("core", "power_energy_joules_total", "package-0", "CPU"),
    ],
)
def test_component_class(tier: str, metric: str, device: str, expected: str) -> None:
    assert component_class(tier, metric, device) == expected


@pytest.mark.parametrize(
    ("component", "device", "labels", "expected"),
    [
        (
            "GPU",
            "gpu2",
            {"uuid": "GPU-ab", "pci_bus_id": "0000:3b:00.0"},
            [("GPU", "2"), ("GPU_UUID", "GPU-ab"), ("PCI", "0000:3b:00.0")],
        ),
        ("GPU", "0000:3b:00.0", {}, [("PCI", "0000:3b:00.0")]),
        ("Disk", "nvme0n1", {}, [("DISK", "nvme0n1")]),
        ("NIC", "eth0", {}, [("NIC", "eth0")]),
        ("Node", "0000:3b:00.0", {}, [("PCI", "0000:3b:00.0")]),
        ("CPU", "cpu", {}, []),
        ("Memory", "memory", {}, []),
    ],
)
def test_entities(component: str, device: str, labels: dict[str, str], expected: list[tuple[str, str]]) -> None:
    assert entities_for(component, device, labels) == tuple(Entity(t, v) for t, v in expected)


def test_rule_defaults() -> None:
    warn = rule_health(cond(), op=">")
    assert (warn.check_name, warn.component_class, warn.is_fatal, warn.recommended_action) == (
        "NvdaemonLoadHigh",
        "CPU",
        False,
        "NONE",
    )
    assert warn.error_code == ("load_high",) and warn.entities == ()
    assert warn.processing_strategy == "EXECUTE_REMEDIATION"
    assert warn.message == "load_high: load1 on cpu is 24.51, threshold > 16"
    crit = rule_health(cond(severity="critical", metric="disk_io_time_seconds_total", device="sda"))
    assert (crit.is_fatal, crit.recommended_action, crit.component_class) == (True, "CONTACT_SUPPORT", "Disk")
    assert crit.entities == (Entity("DISK", "sda"),)
    labelled = rule_health(cond(metric="psi_stall_ratio_avg10", device="memory", labels=(("share", "some"),)), op=">=")
    assert "psi_stall_ratio_avg10{share=some} on memory is 24.51, threshold >= 16" in labelled.message
    observe = rule_health(cond(), strategy="STORE_ONLY")
    assert observe.processing_strategy == "STORE_ONLY"


def test_rule_overrides() -> None:
    o = RuleNvsentinel(
        check_name="HostOverloaded",
        component_class="Node",
        fatal=True,
        recommended_action="CUSTOM",
        custom_recommended_action="drain and page the on-call",
        processing_strategy="STORE_AND_ANALYSE",
    )
    h = rule_health(cond(), overrides=o, strategy="STORE_ONLY")
    assert (h.check_name, h.component_class, h.is_fatal, h.recommended_action) == (
        "HostOverloaded",
        "Node",
        True,
        "CUSTOM",
    )
    assert h.custom_recommended_action == "drain and page the on-call"
    assert h.processing_strategy == "STORE_AND_ANALYSE"
    # fatal: false on a critical rule; an explicit action on a non-fatal one
    h = rule_health(cond(severity="critical"), overrides=RuleNvsentinel(fatal=False))
    assert (h.is_fatal, h.recommended_action) == (False, "NONE")
    h = rule_health(cond(), overrides=RuleNvsentinel(recommended_action="RUN_FIELDDIAG"))
    assert (h.is_fatal, h.recommended_action) == (False, "RUN_FIELDDIAG")


@pytest.mark.parametrize(
    ("xid", "action"),
    [
        *[(x, "COMPONENT_RESET") for x in (48, 62, 64, 95, 119, 120, 140)],
        (79, "RESTART_BM"),
        *[(x, "NONE") for x in (13, 31, 43, 45, 63, 92, 94)],
        (61, "CONTACT_SUPPORT"),  # catalogue bucket UNEXPECTED_ERR_REPORT_ISSUE
        (74, "CONTACT_SUPPORT"),  # catalogue bucket WORKFLOW_NVLINK_ERR: no automatic action
        (9999, "CONTACT_SUPPORT"),
        (1, "CONTACT_SUPPORT"),
    ],
)
def test_xid_table(xid: int, action: str) -> None:
    assert xid_action(xid) == action
    h = xid_health(XidRecord(xid=xid, device="gpu0", pci="0000:3b:00.0", uuid="GPU-1"))
    assert h.recommended_action == action
    assert h.is_fatal is (action != "NONE")
    assert (h.check_name, h.component_class, h.error_code) == ("NvdaemonGpuXidError", "GPU", (str(xid),))
    assert h.entities == (Entity("PCI", "0000:3b:00.0"), Entity("GPU_UUID", "GPU-1"))


def test_xid_overrides_and_fatal_follows_action() -> None:
    assert xid_action(13, {"13": "COMPONENT_RESET"}) == "COMPONENT_RESET"
    assert xid_action(48, {"48": "NONE"}) == "NONE"
    assert xid_action(79, {"13": "NONE"}) == "RESTART_BM"
    h = xid_health(XidRecord(xid=48, device="gpu0", pci="0000:3b:00.0"), overrides={"48": "NONE"})
    assert not h.is_fatal
    assert all(a in {"NONE", "COMPONENT_RESET", "RESTART_BM", "CONTACT_SUPPORT"} for a in XID_ACTIONS.values())


def test_every_xid_entry_names_its_source_and_follows_its_bucket() -> None:
    for xid, entry in XID_CATALOGUE.items():
        assert entry.source in XID_SOURCES, xid
        assert entry.description == XID_DESCRIPTIONS[xid]
        if entry.source == UNSOURCED:  # cannot be sourced: a human looks, never an automatic reboot
            assert entry.action == "CONTACT_SUPPORT", xid
        elif entry.source == "nvidia-xid-catalogue":  # the action is the bucket's, as NVSentinel maps buckets
            assert entry.action == bucket_action(entry.bucket), xid
        else:  # non-fatal in the catalogue: no action of its own
            assert entry.action == "NONE", xid
    assert [x for x, e in XID_CATALOGUE.items() if e.source == UNSOURCED] == []
    # what "not yet checked" became, from the catalogue's buckets
    assert {x: XID_CATALOGUE[x].bucket for x in (61, 74, 140)} == {
        61: "UNEXPECTED_ERR_REPORT_ISSUE",
        74: "WORKFLOW_NVLINK_ERR",
        140: "RESET_GPU",
    }


@pytest.mark.parametrize(
    ("bucket", "action"),
    [
        ("RESTART_APP", "NONE"),
        ("IGNORE", "NONE"),
        ("RESET_GPU", "COMPONENT_RESET"),
        ("WORKFLOW_XID_48", "COMPONENT_RESET"),
        ("RESET_FABRIC", "COMPONENT_RESET"),
        ("RESTART_BM", "RESTART_BM"),
        ("REPLACE_VM", "REPLACE_VM"),
        (" RESET_GPU ", "COMPONENT_RESET"),  # the catalogue has cells with stray spaces; NVSentinel trims them
        ("UNEXPECTED_ERR_REPORT_ISSUE", "CONTACT_SUPPORT"),
        ("WORKFLOW_NVLINK_ERR", "CONTACT_SUPPORT"),
        ("CHECK_MECHANICALS", "CONTACT_SUPPORT"),
    ],
)
def test_bucket_action(bucket: str, action: str) -> None:
    assert bucket_action(bucket) == action


def test_every_action_name_is_a_recommended_action() -> None:
    assert set(RECOMMENDED_ACTIONS) == ACTION_NAMES


def test_lost_gpu_is_fatal_restart_bm_with_the_gpu_entities() -> None:
    rec = LostGpu("gpu5", pci="00000000:AB:00.0", uuid="GPU-5a", error="gpu5: GPU is lost")
    h = lost_health(rec, strategy="STORE_ONLY")
    assert (h.check_name, h.component_class, h.error_code) == ("NvdaemonGpuFallenOff", "GPU", ("GPU_FALLEN_OFF_BUS",))
    assert (h.is_fatal, h.recommended_action, h.processing_strategy) == (True, "RESTART_BM", "STORE_ONLY")
    assert h.entities == (Entity("GPU", "5"), Entity("GPU_UUID", "GPU-5a"), Entity("PCI", "00000000:AB:00.0"))
    assert h.message == "gpu5 fell off the bus: gpu5: GPU is lost"
    clear = healthy_event(h, agent="nvdaemon", node="n")
    assert clear.is_healthy and clear.entities == h.entities and clear.error_code == h.error_code
    # identity unknown (NVML could not say): the GPU index alone
    assert lost_health(LostGpu("gpu2")).entities == (Entity("GPU", "2"),)


def test_a_lost_gpu_answers_by_uuid_then_pci_then_index() -> None:
    full = LostGpu("gpu5", pci="00000000:AB:00.0", uuid="GPU-5a")
    assert full.answers("gpu4", "GPU-5a", "00000000:9A:00.0")  # moved index after a reboot: still the same GPU
    assert not full.answers("gpu5", "GPU-other", "00000000:AB:00.0")  # another GPU now at that index
    assert LostGpu("gpu5", pci="00000000:AB:00.0").answers("gpu1", "GPU-x", "00000000:AB:00.0")
    assert LostGpu("gpu5").answers("gpu5", "GPU-x", "")
    assert not LostGpu("gpu5").answers("gpu4", "GPU-x", "")


def test_xid_entities_fall_back_to_the_device() -> None:
    assert xid_health(XidRecord(xid=79, device="0000:b3:00.0")).entities == (Entity("PCI", "0000:b3:00.0"),)
    assert xid_health(XidRecord(xid=79, device="gpu3")).entities == (Entity("GPU", "gpu3"),)


def test_series_sharing_a_key_merge_fatal_first() -> None:
    some = rule_health(cond(metric="psi_stall_ratio_avg10", device="memory", labels=(("share", "some"),)))
    full = rule_health(
        cond(metric="psi_stall_ratio_avg10", device="memory", labels=(("share", "full"),), severity="critical")
    )
    (merged,) = merge([some, full]).values()
    assert merged.is_fatal and "share=some" in merged.message and "share=full" in merged.message


def test_plan_baselines_first_then_clears_then_raises_and_nothing_when_equal() -> None:
    hot = rule_health(
        cond(condition="cpu_hot", metric="temp_celsius", device="hwmon0/coretemp/temp1", severity="critical")
    )
    load = rule_health(cond())
    checks = [CheckSpec("NvdaemonCpuHot", "CPU", "EXECUTE_REMEDIATION"), CheckSpec("NvdaemonLoadHigh", "CPU", "X")]
    changes = plan({hot.key: hot}, {load.key: load}, checks=checks, baselined=["NvdaemonLoadHigh"], agent="a", node="n")
    assert [(c.kind, c.key[0]) for c in changes] == [
        ("baseline", "NvdaemonCpuHot"),
        ("clear", "NvdaemonLoadHigh"),
        ("raise", "NvdaemonCpuHot"),
    ]
    assert changes[0].event.entities == () and changes[0].event.is_healthy
    assert plan({hot.key: hot}, {hot.key: hot}, agent="a", node="n") == []
    # a new value is not a change; a new action is
    import msgspec

    hotter = msgspec.structs.replace(hot, message="hotter")
    assert plan({hot.key: hotter}, {hot.key: hot}, agent="a", node="n") == []
    reset = msgspec.structs.replace(hot, recommended_action="COMPONENT_RESET")
    assert [c.kind for c in plan({hot.key: reset}, {hot.key: hot}, agent="a", node="n")] == ["raise"]


def test_clear_mirrors_the_reported_fault() -> None:
    fault = xid_health(XidRecord(xid=79, device="gpu0", pci="0000:3b:00.0", uuid="GPU-1"), strategy="STORE_ONLY")
    ev = healthy_event(fault, agent="nvdaemon", node="n")
    assert ev.is_healthy and not ev.is_fatal and ev.recommended_action == "NONE"
    assert (ev.check_name, ev.entities, ev.error_code, ev.processing_strategy, ev.component_class) == (
        fault.check_name,
        fault.entities,
        fault.error_code,
        "STORE_ONLY",
        "GPU",
    )
