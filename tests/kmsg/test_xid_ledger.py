"""One XID, one event (nvdaemon/gpu/xid_ledger.py): the reports of NVML and the kernel log merged within the merge
window, repeats folded until ``repeat_seconds`` of quiet, GPUs matched by PCI address, recoveries, and the folds
carried across a restart. Time is passed in; ``emit`` collects, ``next_seq`` counts."""

from __future__ import annotations

import pytest

from nvdaemon.gpu.xid_ledger import RECOVERED_CONDITION, XidLedger, pci_key
from nvdaemon.model import Event, Phase
from nvdaemon.nvml import GpuIdentity

NODE = "node-a"
T0 = 1_733_140_000.0
MERGE = 2.0
REPEAT = 3600.0
KMSG_PCI = "0000:3b:00"  # how the kernel's NVRM lines write it
NVML_PCI = "00000000:3B:00.0"  # how NVML does
GPU2 = GpuIdentity(2, "GPU-6e5a2b1c-1111-2222-3333-444455556666", "NVIDIA H100", NVML_PCI)
LINE = f"NVRM: Xid (PCI:{KMSG_PCI}): 79, pid=1234, name=python, GPU has fallen off the bus."


class Published:
    """The ledger's ``emit`` and ``next_seq``: what it published, in order, and the seqs it drew."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.seq = 0

    def emit(self, events: list[Event]) -> None:
        self.events.extend(events)

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq


def ledger(*live: str) -> tuple[XidLedger, Published]:
    out = Published()
    led = XidLedger(node=NODE, emit=out.emit, next_seq=out.next_seq, merge_seconds=MERGE, repeat_seconds=REPEAT)
    led.live = set(live)
    return led, out


def kmsg(led: XidLedger, xid: int, at: float, pci: str = KMSG_PCI) -> list[Event]:
    return led.report("kmsg", xid, T0 + at, pci=pci, message=LINE)


def nvml(led: XidLedger, xid: int, at: float, ident: GpuIdentity = GPU2) -> list[Event]:
    return led.report("nvml", xid, T0 + at, ident=ident)


@pytest.mark.parametrize("live", [(), ("kmsg",)])
def test_one_live_source_reports_at_once(live: tuple[str, ...]) -> None:
    led, out = ledger(*live)
    events = kmsg(led, 79, 0)
    assert events == out.events
    (ev,) = events
    assert (ev.condition, ev.phase, ev.seq, ev.started_at) == ("gpu_xid_error", Phase.ENTER, 1, T0)
    assert ev.detail["xid"] == 79
    assert ev.detail["sources"] == ["kmsg"]
    assert ev.detail["message"] == LINE
    assert led.next_deadline() == T0 + REPEAT


def test_both_live_the_second_report_sends_one_event_naming_both() -> None:
    led, out = ledger("kmsg", "nvml")
    assert kmsg(led, 79, 0) == []
    assert led.next_deadline() == T0 + MERGE
    (ev,) = nvml(led, 79, 0.4)
    assert out.events == [ev]
    assert ev.detail["sources"] == ["kmsg", "nvml"]
    assert ev.started_at == T0  # the first report's time
    assert (ev.device, ev.detail["gpu_uuid"], ev.detail["pci_bus_id"]) == ("gpu2", GPU2.uuid, NVML_PCI)
    assert ev.detail["message"] == LINE
    # NVML first, kernel log second: the same one event
    led, out = ledger("kmsg", "nvml")
    assert nvml(led, 79, 0) == []
    (ev,) = kmsg(led, 79, 0.1)
    assert (ev.detail["sources"], ev.started_at, ev.device) == (["kmsg", "nvml"], T0, "gpu2")


@pytest.mark.parametrize("first", ["kmsg", "nvml"])
def test_only_one_of_two_live_reports_it_goes_out_at_the_deadline(first: str) -> None:
    led, out = ledger("kmsg", "nvml")
    assert (kmsg(led, 79, 0) if first == "kmsg" else nvml(led, 79, 0)) == []
    assert led.due(T0 + MERGE - 0.01) == []
    (ev,) = led.due(T0 + MERGE)
    assert out.events == [ev]
    assert (ev.detail["sources"], ev.started_at) == ([first], T0)
    assert led.due(T0 + MERGE + 1) == []  # sent once
    # the other source's late report is a repeat, counted, not sent
    assert (nvml(led, 79, 3) if first == "kmsg" else kmsg(led, 79, 3)) == []
    (fold,) = led.folds()
    assert (fold.count, sorted(fold.sources)) == (2, ["kmsg", "nvml"])


def test_repeats_are_counted_until_repeat_seconds_of_quiet() -> None:
    led, out = ledger("kmsg")
    kmsg(led, 95, 0)
    for i in range(1, 100):
        assert kmsg(led, 95, i) == []
    (fold,) = led.folds()
    assert (fold.count, fold.sent, fold.last_at) == (100, True, T0 + 99)
    assert led.next_deadline() == T0 + 99 + REPEAT
    assert led.due(T0 + 99 + REPEAT - 1) == []
    assert len(led.folds()) == 1
    assert led.due(T0 + 99 + REPEAT) == []  # the end of a fold is not an event
    assert led.folds() == []
    (again,) = kmsg(led, 95, 99 + REPEAT + 1)
    assert [e.seq for e in out.events] == [1, 2]
    assert again.started_at == T0 + 99 + REPEAT + 1


def test_folds_are_per_gpu_and_xid() -> None:
    led, out = ledger("kmsg")
    kmsg(led, 79, 0)
    kmsg(led, 48, 1)
    kmsg(led, 79, 2, pci="0000:3f:00")
    kmsg(led, 79, 3, pci="0000:3B:00.0")  # the first GPU, written another way
    assert [(e.device, e.detail["xid"]) for e in out.events] == [(KMSG_PCI, 79), (KMSG_PCI, 48), ("0000:3f:00", 79)]


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("0000:3b:00", "0000:3b:00"),
        ("0000:3b:00.0", "0000:3b:00"),
        ("3b:00", "0000:3b:00"),
        ("3B:00.1", "0000:3b:00"),
        (" 0018:01:00 ", "0018:01:00"),
        ("00000001:C3:1F.7", "0001:c3:1f"),
        ("", ""),
        ("garbage", ""),
        ("0000:3b", ""),
        ("0000:3b:00.8", ""),  # no function 8
        ("zz:00", ""),
        ("GPU-6e5a2b1c-1111", ""),
    ],
)
def test_pci_key(address: str, key: str) -> None:
    assert pci_key(address) == key


def test_identity_names_the_gpu_nvml_knows() -> None:
    led, _ = ledger("kmsg")
    asked: list[str] = []

    def identity(key: str) -> GpuIdentity | None:
        asked.append(key)
        return GPU2 if key == KMSG_PCI else None

    led.identity = identity
    (known,) = kmsg(led, 79, 0)
    (unknown,) = kmsg(led, 79, 1, pci="0000:3f:00")
    assert asked == [KMSG_PCI, "0000:3f:00"]
    assert (known.device, known.detail["gpu_uuid"], known.detail["pci_bus_id"]) == ("gpu2", GPU2.uuid, NVML_PCI)
    assert (unknown.device, unknown.detail["gpu_uuid"], unknown.detail["pci_bus_id"]) == (
        "0000:3f:00",
        "",
        "0000:3f:00",
    )


@pytest.mark.parametrize(
    "how",
    [{"pci": KMSG_PCI}, {"pci": NVML_PCI}, {"uuid": GPU2.uuid}, {"ident": GPU2}],
    ids=["kernel-pci", "nvml-pci", "uuid", "ident"],
)
def test_recover_ends_the_folds_of_one_gpu(how: dict[str, object]) -> None:
    led, out = ledger("kmsg", "nvml")
    nvml(led, 79, 0)
    kmsg(led, 79, 0.1)
    nvml(led, 48, 1)
    led.due(T0 + 10)
    nvml(led, 79, 11, ident=GpuIdentity(5, "GPU-other", "", "00000000:5E:00.0"))
    led.due(T0 + 20)
    assert len(out.events) == 3
    (rec,) = led.recover(T0 + 30, signal="xid154", **how)  # type: ignore[arg-type]
    assert out.events[-1] == rec
    assert (rec.condition, rec.phase, rec.severity, rec.device, rec.seq) == (
        RECOVERED_CONDITION,
        Phase.ENTER,
        "info",
        "gpu2",
        4,
    )
    assert rec.detail["xids"] == [48, 79]
    assert (rec.detail["signal"], rec.detail["gpu_uuid"], rec.detail["pci_bus_id"]) == ("xid154", GPU2.uuid, NVML_PCI)
    assert [(f.gpu, f.xid) for f in led.folds()] == [("0000:5e:00", 79)]  # the other GPU's fold stays
    assert led.recover(T0 + 31, signal="xid154", **how) == []  # type: ignore[arg-type]
    assert nvml(led, 79, 40) == []  # a new fault after the recovery is news again: a new fold, merged as before
    (again,) = kmsg(led, 79, 40.1)
    assert (again.detail["sources"], again.started_at, again.seq) == (["kmsg", "nvml"], T0 + 40, 5)


def test_recover_with_nothing_folded_is_silent() -> None:
    led, out = ledger("kmsg")
    assert led.recover(T0, pci=KMSG_PCI, signal="gpu_initialised") == []
    assert led.recover(T0, uuid=GPU2.uuid, signal="reset_executed") == []
    kmsg(led, 79, 0)
    assert led.recover(T0 + 1, pci="0000:3f:00", signal="gpu_initialised") == []
    assert len(out.events) == 1


def test_recover_of_a_gpu_nvml_does_not_know_names_its_bus_id() -> None:
    led, out = ledger("kmsg")
    kmsg(led, 79, 0, pci="0000:3f:00")
    (rec,) = led.recover(T0 + 1, pci="0000:3f:00", signal="gpu_initialised")
    assert out.events[-1] == rec
    assert (rec.device, rec.detail["xids"], rec.detail["pci_bus_id"]) == ("0000:3f:00", [79], "0000:3f:00")


def test_folds_and_restore_carry_only_sent_folds() -> None:
    led, out = ledger("kmsg", "nvml")
    kmsg(led, 79, 0)  # sent at the deadline
    led.due(T0 + MERGE)
    kmsg(led, 79, 3)
    kmsg(led, 48, 4)  # still waiting for NVML: never published
    saved = led.folds()
    assert [e.detail["xid"] for e in out.events] == [79]
    assert [(f.xid, f.sent, f.count) for f in saved] == [(48, False, 1), (79, True, 2)]

    restored, after = ledger("kmsg", "nvml")
    restored.restore(saved)
    assert [(f.xid, f.count) for f in restored.folds()] == [(79, 2)]
    assert kmsg(restored, 79, 5) == []  # the restart does not send it again
    assert restored.due(T0 + 100) == []
    assert after.events == []
    assert restored.folds()[0].count == 3


def test_forget_all() -> None:
    led, out = ledger("kmsg")
    kmsg(led, 79, 0)
    kmsg(led, 48, 0)
    assert led.forget_all() == 2
    assert led.folds() == []
    assert len(kmsg(led, 79, 1)) == 1  # after a reboot the same XID is news again
    assert [e.detail["xid"] for e in out.events] == [79, 48, 79]


def test_nvlink5_subcode_and_xid_events_are_enter_only() -> None:
    led, out = ledger("kmsg", "nvml")
    led.report(
        "kmsg",
        149,
        T0,
        pci="0018:01:00",
        message="NVRM: Xid ...: 149, NETIR_LINK_EVT ...",
        subcode="NETIR_LINK_EVT link 09",
    )
    kmsg(led, 79, 0)
    nvml(led, 79, 0.5)
    led.due(T0 + 10)
    kmsg(led, 79, 20)
    led.recover(T0 + 30, pci=KMSG_PCI, signal="reset_executed")
    led.due(T0 + 10 * REPEAT)
    subcodes = {e.detail["xid"]: e.detail.get("subcode") for e in out.events if e.condition == "gpu_xid_error"}
    assert subcodes == {149: "NETIR_LINK_EVT link 09", 79: None}
    assert all(e.phase is Phase.ENTER and e.ended_at is None for e in out.events)
    assert [e.seq for e in out.events] == list(range(1, len(out.events) + 1))
