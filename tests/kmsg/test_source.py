"""The kernel-log source (``nvdaemon/kmsg/source.py``) on a fixture host's ``dev/kmsg``, on the mock clock.

Each test builds a ``KmsgSource`` as ``service.build_source`` does, over a host directory holding ``dev/kmsg``
(records written with ``record.record_line``), ``proc/uptime`` and ``proc/sys/kernel/random/boot_id``, with an
engine state of its own, an XID ledger, no durable sink (``held_seq`` is infinite) and a wall clock that follows
trio's (``wall``), so that record times, merge deadlines and the source's timers agree. Covered: every record kind
of ``fixtures/hosts/kmsg``; a restart in the middle of a log (nothing read twice, nothing missed); records the ring
buffer dropped (a gap in the seqs); a reboot (lookback, conditions EXIT, XID folds forgotten); a storm against
``maxRecordsPerSecond``; a path that cannot be read; and one XID reported by both NVML and the kernel log.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from nvdaemon.config import KernelLogConfig
from nvdaemon.engine import EngineState, draw_seq
from nvdaemon.gpu import GpuRuntime
from nvdaemon.gpu.xid_ledger import XidLedger
from nvdaemon.kmsg.position import POSITION_FILE, load_position
from nvdaemon.kmsg.record import record_line
from nvdaemon.kmsg.rules import CompiledKernelRule, compile_rules
from nvdaemon.kmsg.service import BOOT_ID, UPTIME, configure_ledger
from nvdaemon.kmsg.source import KmsgSource
from nvdaemon.model import Event, Phase
from nvdaemon.nvml import XidNotice
from nvdaemon.nvml.fake import FakeNvml
from tests.polling import until

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURE = ROOT / "fixtures" / "hosts" / "kmsg"
HEALTHY = ROOT / "fixtures" / "nvml" / "h100-8gpu-healthy.json"
NODE = "kmsg-node"
WALL_OFFSET = 1_700_000_000.0  # the mock clock starts near 0; the wall clock is trio's time plus this
BOOT_A = "11111111-2222-4333-8444-555555555555"
BOOT_B = "99999999-8888-4777-8666-555555555555"
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."

wait = functools.partial(until, timeout=60.0, step=0.05)  # on the trio clock: no real time under autojump_clock


def wall() -> float:
    return trio.current_time() + WALL_OFFSET


class Host:
    """A host root with the three files the source reads."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def new(cls, root: Path, boot_id: str = BOOT_A, uptime: float = 5000.0) -> Host:
        """An empty log, booted ``uptime`` seconds ago."""
        host = cls(root)
        host.kmsg.parent.mkdir(parents=True)
        host.kmsg.touch()
        host.boot(boot_id, uptime)
        return host

    @property
    def kmsg(self) -> Path:
        return self.root / "dev" / "kmsg"

    def boot(self, boot_id: str, uptime: float) -> None:
        (self.root / "proc" / BOOT_ID).parent.mkdir(parents=True, exist_ok=True)
        (self.root / "proc" / BOOT_ID).write_text(boot_id + "\n")
        (self.root / "proc" / UPTIME).write_text(f"{uptime:.2f} 1234.00\n")

    def append(self, records: list[bytes]) -> None:
        with self.kmsg.open("ab") as f:
            f.write(b"".join(records))


class Events:
    """What the source and the ledger published, with the trio time each was published at."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.times: list[float] = []

    def __call__(self, events: list[Event]) -> None:
        self.events += events
        self.times += [trio.current_time()] * len(events)

    def named(self, condition: str, phase: Phase = Phase.ENTER) -> list[Event]:
        return [e for e in self.events if e.condition == condition and e.phase is phase]


class Setup:
    """One agent's worth of what the source is given: engine state, events, ledger; ``source()`` builds a new
    source on them (a restart of the task, or of the agent when given a new ledger)."""

    def __init__(self, host: Host, state_dir: Path, cfg: KernelLogConfig | None = None) -> None:
        self.host = host
        self.state_dir = state_dir
        self.cfg = cfg or KernelLogConfig()
        self.rules: list[CompiledKernelRule] = compile_rules([], defaults=self.cfg.default_rules)
        self.state = EngineState()
        self.out = Events()
        self.ledger = self.new_ledger()

    def new_ledger(self) -> XidLedger:
        ledger = XidLedger(node=NODE, emit=self.out, next_seq=lambda: draw_seq(self.state))
        configure_ledger(ledger, self.cfg)
        return ledger

    def source(self, gpu: GpuRuntime | None = None) -> KmsgSource:
        async def persist_engine() -> None:
            pass

        root = self.host.root
        return KmsgSource(
            self.cfg,
            self.rules,
            path=root / "dev" / "kmsg",
            position_path=self.state_dir / POSITION_FILE,
            boot_id_path=root / "proc" / BOOT_ID,
            uptime_path=root / "proc" / UPTIME,
            node=NODE,
            state=lambda: self.state,
            emit=self.out,
            ledger=self.ledger,
            persist_engine=persist_engine,
            held_seq=lambda: math.inf,
            gpu=gpu,
            clock=wall,
        )


@contextlib.asynccontextmanager
async def running(source: KmsgSource) -> AsyncIterator[KmsgSource]:
    """The source's task from ``started`` until the block ends (then cancelled: its ``finally`` saves the position)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(source.serve)
        yield source
        nursery.cancel_scope.cancel()


async def read_all(source: KmsgSource, n: int) -> None:
    await wait(lambda: source.counters.read >= n, lambda: f"{n} records read; got {source.status()}")
    assert source.counters.read == n


def xid_line(seq: int, code: int, usec: int, pci: str = "0000:3b:00") -> bytes:
    return record_line(4, seq, usec, f"NVRM: Xid (PCI:{pci}): {code}, pid={seq}, name=test, record {seq}")


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host.new(tmp_path / "host")


# ---- every kind of record ------------------------------------------------------------------------------------------
EXPECTED_FIXTURE = {  # (condition, device): what fixtures/hosts/kmsg raises, each once
    ("gpu_xid_error", "0000:3b:00"): 2,  # XIDs 79 and 154 (to Node Reboot Required: a fault, not a recovery)
    ("gpu_xid_error", "0018:01:00"): 1,  # NVLink5 XID 149
    ("gpu_fallen_off", "0000:3b:00.0"): 1,
    ("nvswitch_sxid_error", "nvswitch0"): 1,
    ("kernel_oom_kill", "kernel"): 1,
    ("kernel_task_hung", "kernel"): 1,
    ("filesystem_error", "nvme0n1p2"): 1,
    ("filesystem_read_only", "kernel"): 1,
    ("block_io_error", "sdb1"): 1,
    ("nvme_timeout", "nvme1"): 1,  # the third timeout within 600 s
    ("nvme_reset", "nvme1"): 1,
    ("machine_check", "kernel"): 1,
    ("machine_check_exception", "2"): 1,
    ("memory_read_error", "CPU_SrcID#0_MC#0_Chan#1_DIMM#0"): 1,
    ("hardware_error_cper_fatal", "kernel"): 1,
}


async def test_every_fixture_record_kind_raises_its_event(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    root = tmp_path / "host"
    shutil.copytree(FIXTURE, root)
    records = len([line for line in (root / "dev" / "kmsg").read_bytes().splitlines() if not line.startswith(b" ")])
    s = Setup(Host(root), tmp_path / "state")  # the fixture's boot id and uptime: every record within the lookback
    src = s.source()
    async with running(src):
        await read_all(src, records)
        # The NVMe timeouts were logged 2500 s before now: quiet for longer than the rule's clearAfterSeconds (1800),
        # so nvme_timeout EXITs as soon as the source's timer looks, with the time of its last match as evidence.
        await wait(lambda: s.out.named("nvme_timeout", Phase.EXIT), "nvme_timeout EXIT (quiet)")
        got: dict[tuple[str, str], int] = {}
        for e in s.out.events:
            assert e.node == NODE, e
            if e.phase is Phase.ENTER:
                got[(e.condition, e.device)] = got.get((e.condition, e.device), 0) + 1
        assert got == EXPECTED_FIXTURE
        (quiet,) = [e for e in s.out.events if e.phase is Phase.EXIT]
        assert (quiet.condition, quiet.device, quiet.detail["reason"]) == ("nvme_timeout", "nvme1", "quiet")
        assert src.counters.parsed == records - 1  # all but "NET: Registered ...": no prefilter literal in it
        assert src.counters.lost == 0 and sum(src.counters.skipped.values()) == 0

        xids = {e.detail["xid"]: e for e in s.out.named("gpu_xid_error")}
        assert set(xids) == {79, 149, 154}
        assert xids[79].detail["sources"] == ["kmsg"]
        assert "GPU has fallen off the bus" in str(xids[79].detail["message"])
        assert xids[149].detail["subcode"] == "NETIR_LINK_EVT link 09"
        boot_wall = src.boot_wall
        assert boot_wall is not None and xids[79].started_at == pytest.approx(boot_wall + 1843.308145)
        (sxid,) = s.out.named("nvswitch_sxid_error")
        assert sxid.severity == "critical"
        assert {k: sxid.detail[k] for k in ("sxid", "fatal", "link")} == {
            "sxid": "24007",
            "fatal": "true",
            "link": "30",
        }
        (oom,) = s.out.named("kernel_oom_kill")
        assert (oom.detail["pid"], oom.detail["process"], oom.tier) == ("48213", "python3", "kernel")
        conditions = {c.condition for c in s.state.active.values()}
        assert conditions == {
            "gpu_fallen_off",
            "nvswitch_sxid_error",
            "filesystem_read_only",
            "hardware_error_cper_fatal",
        }

        # The same XID again: counted in its fold, not sent again (until a recovery signal or repeatSeconds).
        before = len(s.out.events)
        s.host.append([record_line(4, 1222, 3_000_000_000, XID_79)])
        await read_all(src, records + 1)
        assert src.counters.matches["xid"] == 4
        assert len(s.out.events) == before, s.out.events[before:]
        assert [f.count for f in s.ledger.folds() if f.xid == 79] == [2]


# ---- restarts --------------------------------------------------------------------------------------------------------
async def test_restart_in_the_middle_reads_exactly_the_new_records(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    n, m = 20, 7
    usec = 4_000_000_000  # 4000 s after boot, uptime 5000: within the lookback
    lines = [xid_line(100 + i, 1 + i, usec + i) for i in range(n + m)]  # a new XID code each: one event each
    s = Setup(host, tmp_path / "state")
    host.append(lines[:n])
    first = s.source()
    async with running(first):
        await read_all(first, n)
    assert load_position(s.state_dir / POSITION_FILE).seq == 100 + n - 1
    assert [e.detail["xid"] for e in s.out.events] == list(range(1, n + 1))

    host.append(lines[n:])
    s.ledger = s.new_ledger()  # a restart of the agent: the ledger from the saved folds only
    second = s.source()
    async with running(second):
        await read_all(second, n + m)
        assert second.counters.skipped["seen"] == n
        assert second.counters.parsed == m and second.counters.lost == 0
    assert [e.detail["xid"] for e in s.out.events] == list(range(1, n + m + 1))
    assert [str(e.detail["message"]).rsplit(" ", 1)[1] for e in s.out.events] == [str(100 + i) for i in range(n + m)]
    assert len({e.seq for e in s.out.events}) == n + m


async def test_a_gap_in_the_seqs_counts_the_records_lost(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    host.append([record_line(6, seq, 4_000_000_000 + seq, f"boring {seq}") for seq in (1, 2, 3, 4, 5, 9, 10)])
    src = Setup(host, tmp_path / "state").source()
    async with running(src):
        await read_all(src, 7)
        assert src.counters.lost == 3
        assert src.status()["recordsLost"] == 3 and src.status()["lastSeq"] == 10


async def test_a_record_a_process_wrote_is_skipped_not_matched(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A write to /dev/kmsg gets a facility other than the kernel's (the kernel refuses facility 0 to writers): an
    `echo` of an XID or an OOM line into the log raises nothing; the same text from the kernel does."""
    usec = 4_000_000_000
    user_xid = record_line(1 * 8 + 4, 1, usec, XID_79)  # LOG_USER, warning: what `echo ... > /dev/kmsg` makes
    daemon_oom = record_line(3 * 8 + 3, 2, usec + 1, "Out of memory: Killed process 7 (x) total-vm:10kB, rss:1kB")
    host.append([user_xid, daemon_oom, record_line(4, 3, usec + 2, XID_79)])
    s = Setup(host, tmp_path / "state")
    src = s.source()
    async with running(src):
        await read_all(src, 3)
        await wait(lambda: len(s.out.events) == 1, lambda: f"one event; got {s.out.events}")
    assert src.counters.skipped["userspace"] == 2
    assert [(e.condition, e.device) for e in s.out.events] == [("gpu_xid_error", "0000:3b:00")]


async def test_reboot_skips_old_records_exits_conditions_and_forgets_xid_folds(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    s = Setup(host, tmp_path / "state", KernelLogConfig(lookback_seconds=60.0))
    usec = 4_990_000_000  # 10 s before the boot's uptime of 5000 s: within the lookback
    host.append(
        [
            record_line(2, 500, usec, "EXT4-fs (sda1): Remounting filesystem read-only"),
            record_line(4, 501, usec + 1, "nvidia-nvswitch1: SXid (PCI:0000:c4:00.0): 20034, Fatal, Link 3 fault"),
            record_line(4, 502, usec + 2, XID_79),
        ]
    )
    first = s.source()
    async with running(first):
        await read_all(first, 3)
    entered = {e.condition: e for e in s.out.events}
    assert set(entered) == {"filesystem_read_only", "nvswitch_sxid_error", "gpu_xid_error"}
    assert load_position(s.state_dir / POSITION_FILE).boot_id == BOOT_A

    # Boot B, 100 s ago: its log starts again at seq 0; lookback 60 s reads what was logged after 40 s of uptime.
    host.kmsg.write_bytes(b"")
    host.boot(BOOT_B, 100.0)
    host.append(
        [
            record_line(6, 0, 1_000_000, "Linux version 6.8.0"),
            record_line(4, 1, 30_000_000, "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=old, before the lookback"),
            record_line(4, 2, 50_000_000, XID_79),
        ]
    )
    before = len(s.out.events)
    second = s.source()  # the same ledger: a reboot must end its folds, not a new process
    async with running(second):
        await read_all(second, 3)
        assert second.counters.skipped["lookback"] == 2 and second.counters.skipped["seen"] == 0
        assert second.counters.lost == 0
    new = s.out.events[before:]
    exits = [e for e in new if e.phase is Phase.EXIT]
    assert sorted(e.condition for e in exits) == ["filesystem_read_only", "nvswitch_sxid_error"]
    for e in exits:
        assert e.detail["reason"] == "reboot"
        assert e.started_at == entered[e.condition].started_at
    assert not [k for k in s.state.active if k[0].startswith("kmsg:")]
    (again,) = [e for e in new if e.condition == "gpu_xid_error"]  # the same XID, a new boot: a new fault
    assert again.detail["xid"] == 79 and again.seq > entered["gpu_xid_error"].seq
    assert load_position(s.state_dir / POSITION_FILE).boot_id == BOOT_B


# ---- a storm ---------------------------------------------------------------------------------------------------------
STORM = 100_000  # of each kind: one XID line repeated, and OOM kills of distinct processes


async def test_storm_costs_reads_not_parses_and_the_source_stays_up(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    budget = 1000
    s = Setup(host, tmp_path / "state", KernelLogConfig(max_records_per_second=budget))
    usec = 4_000_000_000
    xids = [record_line(4, i, usec + i, XID_79) for i in range(STORM)]
    ooms = [
        record_line(
            3, STORM + i, usec + STORM + i, f"Out of memory: Killed process {10_000 + i} (worker) total-vm:{i}kB"
        )
        for i in range(STORM)
    ]
    host.append(xids + ooms)
    src = s.source()
    began = trio.current_time()
    async with running(src):
        await read_all(src, 2 * STORM)
        windows = math.floor(trio.current_time() - began) + 1  # one-second budget windows the run spanned
        c = src.counters
        assert c.parsed <= budget * (windows + 1)
        assert c.skipped["budget"] > 0
        assert c.matches["xid"] == STORM  # a repeat of a remembered line is counted without a parse
        assert [e.detail["xid"] for e in s.out.named("gpu_xid_error")] == [79]
        assert len(s.out.named("kernel_oom_kill")) == 1  # the rest folded into the rule's window
        assert src.up

        # A record over the budget is skipped, not deferred: the next one is logged once the storm's window ended.
        await trio.sleep(1.0)
        s.host.append([xid_line(2 * STORM, 48, usec + 3 * STORM, pci="0000:5d:00")])
        await wait(lambda: len(s.out.named("gpu_xid_error")) == 2, "the XID logged after the storm")
        assert s.out.named("gpu_xid_error")[1].device == "0000:5d:00"


# ---- a path that cannot be read --------------------------------------------------------------------------------------
async def test_absent_kmsg_reports_the_source_absent(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    host.kmsg.unlink()
    src = Setup(host, tmp_path / "state").source()
    async with running(src):
        assert not src.up and not src.present
        assert "not present" in src.status()["problem"]


async def test_kmsg_that_is_a_directory_is_unreadable_not_a_crash(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    host.kmsg.unlink()
    host.kmsg.mkdir()
    s = Setup(host, tmp_path / "state")
    src = s.source()
    async with running(src):
        assert not src.up and src.present
        assert "unreadable" in src.status()["problem"]
        # A log in its place: opened on the next try (REOPEN_SECONDS, on the mock clock) and read.
        host.kmsg.rmdir()
        host.append([xid_line(1, 31, 4_000_000_000)])
        await wait(lambda: src.up and src.counters.read == 1, lambda: f"the log read; got {src.status()}", timeout=120)
        assert src.status()["problem"] == "" and [e.detail["xid"] for e in s.out.events] == [31]


@pytest.mark.skipif(os.geteuid() == 0, reason="running as root, which reads a file of mode 000 all the same")
async def test_kmsg_without_read_permission_is_unreadable(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    host.kmsg.chmod(0)
    src = Setup(host, tmp_path / "state").source()
    async with running(src):
        assert not src.up and src.present
        assert "unreadable" in src.status()["problem"]


# ---- one XID from NVML and the kernel log ----------------------------------------------------------------------------
def gpu_runtime(s: Setup) -> GpuRuntime:
    backend = FakeNvml(HEALTHY)
    rt = GpuRuntime(backend, backend.open(), node=NODE, emit=s.out, next_seq=lambda: draw_seq(s.state), ledger=s.ledger)
    s.ledger.live.add("nvml")  # what the XID source does once NVML's event set is registered
    return rt


async def test_nvml_and_kernel_log_report_one_xid_as_one_event(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    s = Setup(host, tmp_path / "state")
    rt = gpu_runtime(s)
    ident = rt.identity(2)
    assert ident.pci_bus_id == "00000000:3A:00.0"
    src = s.source(gpu=rt)
    async with running(src):
        assert s.ledger.live == {"nvml", "kmsg"}
        assert rt.on_xids([XidNotice(2, 79)], now=wall()) == []  # waits for the kernel log's report
        host.append([record_line(4, 7, 5_000_000_000, "NVRM: Xid (PCI:0000:3a:00): 79, pid=1, name=x, fallen off")])
        await wait(lambda: src.counters.matches["xid"] == 1 and all(f.sent for f in s.ledger.folds()), "fold sent")
    (ev,) = s.out.events
    assert (ev.condition, ev.device) == ("gpu_xid_error", "gpu2")
    assert ev.detail["sources"] == ["kmsg", "nvml"]
    assert ev.detail["gpu_uuid"] == ident.uuid and ev.detail["pci_bus_id"] == ident.pci_bus_id
    assert "fallen off" in str(ev.detail["message"])


async def test_nvml_alone_is_sent_after_the_merge_window(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    s = Setup(host, tmp_path / "state")
    rt = gpu_runtime(s)
    src = s.source(gpu=rt)
    async with running(src):
        asked = trio.current_time()
        assert rt.on_xids([XidNotice(5, 48)], now=wall()) == []
        await wait(lambda: s.out.events, "the XID NVML reported")
    (ev,) = s.out.events
    assert (ev.condition, ev.device, ev.detail["xid"]) == ("gpu_xid_error", "gpu5", 48)
    assert ev.detail["sources"] == ["nvml"]
    assert s.out.times[0] - asked == pytest.approx(s.cfg.xid_merge_seconds, abs=0.05)


async def test_the_position_is_saved_at_most_once_a_second_and_soon_after_the_last_record(
    host: Host, tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nvdaemon.kmsg.source as source_module

    writes: list[float] = []
    from nvdaemon.statefile import atomic_write as real_write

    def counting_write(path: Path, data: bytes) -> None:
        writes.append(trio.from_thread.run_sync(trio.current_time))
        real_write(path, data)

    monkeypatch.setattr(source_module, "atomic_write", counting_write)
    s = Setup(host, tmp_path / "state")
    src = s.source()
    usec = 4_000_000_000
    async with running(src):
        began = trio.current_time()
        for i in range(20):  # a record every 0.25 s for 5 s: each arrives alone (an fsync each, before)
            host.append([record_line(6, 500 + i, usec + i, f"usb 1-1: new device {i}")])
            await wait(lambda i=i: src.counters.read == i + 1, f"record {i} read")  # type: ignore[misc]
            await trio.sleep(0.25)
        # The last record's position is saved without waiting for a next record or the end of the task.
        await wait(lambda: load_position(s.state_dir / POSITION_FILE).seq == 519, "the last position saved")
        elapsed = trio.current_time() - began
        during = list(writes)  # the saves while running (the one at the task's end comes after)
    assert len(during) <= math.ceil(elapsed / source_module.SAVE_SECONDS) + 1, (len(during), elapsed)
    assert all(b - a >= source_module.SAVE_SECONDS for a, b in itertools.pairwise(during))
