"""The kernel-log source's cost (``nvdaemon/kmsg``), in-process, on the real trio clock, over a fixture host's
``dev/kmsg`` (a regular file of records in the kernel's format, read as ``/dev/kmsg`` would give them):

- CPU seconds per 1,000 records: MIXED records like a GPU node's kernel log (nine in ten match nothing: audit,
  network, systemd, USB lines; the rest XIDs on eight GPUs, NVRM notices, OOM kills, hung tasks, NVMe timeouts,
  filesystem errors, an SXID), read once by a ``KmsgSource`` with the built-in rules and no per-second budget (every
  candidate parsed); process CPU time from the start of the source to the last record read;
- a STORM of 100,000 lines, half one XID line repeated and half OOM kills of distinct processes (none alike, so
  the source's memory of recent lines does not absorb them), at the default ``maxRecordsPerSecond``: CPU and wall
  seconds, and the records read, parsed, skipped and the events raised (a storm should cost reads, not parses).

``python -m bench.kmsg`` runs it alone; ``run()`` is the section ``bench/__main__.py`` lists.
"""

from __future__ import annotations

import math
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.table import Row, Target
from nvdaemon.config import KernelLogConfig
from nvdaemon.engine import EngineState, draw_seq
from nvdaemon.gpu.xid_ledger import XidLedger
from nvdaemon.kmsg.position import POSITION_FILE
from nvdaemon.kmsg.record import record_line
from nvdaemon.kmsg.rules import compile_rules
from nvdaemon.kmsg.service import BOOT_ID, UPTIME, configure_ledger
from nvdaemon.kmsg.source import KmsgSource
from nvdaemon.model import Event

MIXED = 50_000
STORM = 100_000
UPTIME_SECONDS = 7200.0  # the records are logged over the last 3,000 s of it: all within the default lookback
FIRST_USEC = 4_000_000_000
PCI = ("0000:18:00", "0000:2a:00", "0000:3a:00", "0000:5d:00", "0000:9a:00", "0000:ab:00", "0000:ba:00", "0000:db:00")

NOISE = (
    'audit: type=1400 audit({t}:{n}): apparmor="DENIED" operation="open" profile="cri-containerd" name="/proc/{n}/"',
    "IPv6: ADDRCONF(NETDEV_CHANGE): veth{n:x}: link becomes ready",
    "cni0: port {p}(veth{n:x}) entered forwarding state",
    "systemd[1]: Started session-{n}.scope - Session {n} of User root.",
    "usb 1-{p}: new high-speed USB device number {n} using xhci_hcd",
    "mlx5_core 0000:{p:02x}:00.0: mlx5e: Link up",
    "EXT4-fs (nvme0n1p{p}): mounted filesystem with ordered data mode. Quota mode: none.",
    "device veth{n:x} entered promiscuous mode",
    "NFSD: Using nfsdcld client tracking operations.",
)
MATCHING = (
    "NVRM: Xid (PCI:{pci}): {xid}, pid={n}, name=python3, Ch 00000008",
    "NVRM: GPU at PCI:{pci}: GPU-6e5a1234-0b1c-4d2e-8f3a-{n:012x}",
    "NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) returned from {n}",
    "Out of memory: Killed process {n} (python3) total-vm:98765432kB, anon-rss:81234567kB, file-rss:1024kB",
    "INFO: task kworker/u64:{p}:{n} blocked for more than 122 seconds.",
    "nvme nvme{p}: I/O tag {n} (e046) opcode 0x2 (I/O Cmd) QID 6 timeout, aborting req_op:READ(0) size:4096",
    "EXT4-fs error (device nvme{p}n1p2): ext4_find_entry:1455: inode #{n}: comm ls: reading directory lblock 0",
    "nvidia-nvswitch{p}: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error",
)


def mixed_lines(n: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    lines = []
    for seq in range(n):
        fields = {"n": rng.randrange(1, 1 << 20), "p": rng.randrange(1, 8), "t": 1_700_000_000 + seq}
        if rng.random() < 0.9:
            text = rng.choice(NOISE).format(**fields)
        else:
            text = rng.choice(MATCHING).format(pci=rng.choice(PCI), xid=rng.choice((13, 31, 43, 48, 63, 79)), **fields)
        lines.append(record_line(rng.choice((3, 4, 6)), seq, FIRST_USEC + seq * 60_000, text))
    return lines


def storm_lines(n: int) -> list[bytes]:
    xid = "NVRM: Xid (PCI:0000:3b:00): 95, pid=1234, name=python3, Uncontained: FBHUB. RST: No, D-RST: No"
    lines = []
    for seq in range(n):
        text = xid if seq % 2 == 0 else f"Out of memory: Killed process {10_000 + seq} (worker) total-vm:{seq}kB"
        lines.append(record_line(4, seq, FIRST_USEC + seq, text))
    return lines


def read_once(lines: list[bytes], cfg: KernelLogConfig) -> dict[str, Any]:
    """One source over a host whose log holds ``lines``, from its start until it read the last of them."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "dev").mkdir()
        (root / "dev" / "kmsg").write_bytes(b"".join(lines))
        (root / "proc" / BOOT_ID).parent.mkdir(parents=True)
        (root / "proc" / BOOT_ID).write_text("5a0c3f2e-7d1b-4c8a-9e6f-0b1d2c3e4f50\n")
        (root / "proc" / UPTIME).write_text(f"{UPTIME_SECONDS:.2f} 0.00\n")
        state = EngineState()
        events: list[Event] = []
        ledger = XidLedger(node="bench", emit=events.extend, next_seq=lambda: draw_seq(state))
        configure_ledger(ledger, cfg)

        async def persist_engine() -> None:
            pass

        source = KmsgSource(
            cfg,
            compile_rules([], defaults=cfg.default_rules),
            path=root / "dev" / "kmsg",
            position_path=root / POSITION_FILE,
            boot_id_path=root / "proc" / BOOT_ID,
            uptime_path=root / "proc" / UPTIME,
            node="bench",
            state=lambda: state,
            emit=events.extend,
            ledger=ledger,
            persist_engine=persist_engine,
            held_seq=lambda: math.inf,
        )

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                await nursery.start(source.serve)
                while source.counters.read < len(lines):  # noqa: ASYNC110 (the source signals nothing per record)
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()

        cpu, wall = time.process_time(), time.perf_counter()
        trio.run(main)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        c = source.counters
        return {
            "cpu_s": cpu,
            "wall_s": wall,
            "read": c.read,
            "parsed": c.parsed,
            "skipped": sum(c.skipped.values()),
            "events": len(events),
        }


def run() -> tuple[list[Row], dict[str, Any]]:
    # Every candidate of the mixed log parsed (no budget: the cost of the work, not of how fast this machine reads
    # through the per-second budget); the storm at the default budget, as the agent runs.
    mixed = read_once(mixed_lines(MIXED), KernelLogConfig(max_records_per_second=1_000_000))
    storm = read_once(storm_lines(STORM), KernelLogConfig())
    raw: dict[str, Any] = {f"kmsg_mixed_{k}": v for k, v in mixed.items()}
    raw.update({f"kmsg_storm_{k}": v for k, v in storm.items()})
    raw["kmsg_cpu_s_per_1000_records"] = per_1000 = mixed["cpu_s"] / (MIXED / 1000)
    rows = [
        Row(
            f"kmsg CPU per 1,000 records ({MIXED:,} mixed, {mixed['events']} events)",
            per_1000,
            "s",
            target=Target("value", "<=", 0.02, "ours: 1,000 records a second within 2 % of a core"),
        ),
        Row(
            f"kmsg {STORM:,}-line storm CPU (wall {storm['wall_s']:.2f} s; read {storm['read']:,}, parsed "
            f"{storm['parsed']:,}, skipped {storm['skipped']:,}, {storm['events']} events)",
            storm["cpu_s"],
            "s",
            target=Target("value", "<=", 2.0, "ours: a storm costs reads, not parses"),
        ),
    ]
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
