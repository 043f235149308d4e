"""mdadm: node_exporter's ``node_md_*`` families of the software RAID arrays in ``<proc>/mdstat``.

Per array: ``node_md_state`` (one series per state node_exporter knows: active, inactive, recovering, resync, check;
1 for the array's current state), ``node_md_disks`` (active/failed/spare), ``node_md_disks_required`` and
``node_md_blocks`` / ``node_md_blocks_synced`` (1 KiB blocks, as mdstat counts them). node_exporter 1.5 reads only
/proc/mdstat (nothing under /sys/block/md*/md). No mdstat (no md driver) is "no data": a failed collector. A file
it cannot parse fails the whole collector with no series, as procfs rejects the file as a whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, gauge
from nvdaemon.goparse import parse_float_or_none, parse_int, trim_space

# The member-status line: "<blocks> blocks ... [<total>/<active>] [UU_]".
_STATUS = re.compile(r"(\d+) blocks .*\[(\d+)/(\d+)\] \[([U_]+)\]", re.ASCII)
# The progress line of a resync/recovery/check: "(<synced>/<total>)", "= 38.2%", "finish=24.1min",
# "speed=200112K/sec". The patterns are greedy like procfs's, so odd lines parse (or fail) the same way.
_SYNCED = re.compile(r"\((\d+)/\d+\)", re.ASCII)
_PERCENT = re.compile(r"= (.+)%")
_FINISH = re.compile(r"finish=(.+)min")
_SPEED = re.compile(r"speed=(.+)[A-Z]")

# node_exporter's state label -> the activity state that sets it to 1 (procfs's spelling).
STATES = {
    "active": "active",
    "inactive": "inactive",
    "recovering": "recovering",
    "resync": "resyncing",
    "check": "checking",
}


class MdstatError(ValueError):
    """/proc/mdstat content that node_exporter (procfs) refuses."""


@dataclass(frozen=True)
class MdArray:
    name: str
    state: str  # active, inactive, or recovering/resyncing/checking while a sync runs (anything else as written)
    disks_active: int
    disks_total: int
    disks_failed: int
    disks_spare: int
    blocks: int
    blocks_synced: int


def _int64(text: str, line: str) -> int:
    try:
        return parse_int(text)
    except ValueError:
        raise MdstatError(f"mdstat: bad number {text[:40]!r} in {line.strip()[:100]!r}") from None


def _status(device_line: str, status_line: str) -> tuple[int, int, int]:
    """(active, total, blocks) from the array's line and the status line below it."""
    fields = status_line.split()
    if not fields:
        raise MdstatError(f"mdstat: unexpected status line {status_line!r}")
    blocks = _int64(fields[0], status_line)
    if "raid0" in device_line or "linear" in device_line:
        # No redundancy, no [n/m] block: every member (each has a [role] index on the array's line) is active.
        total = device_line.count("[")
        return total, total, blocks
    if "inactive" in device_line:
        return 0, 0, blocks
    match = _STATUS.search(status_line)
    if match is None:
        raise MdstatError(f"mdstat: no [total/active] [U_] in status line {status_line.strip()[:100]!r}")
    return _int64(match.group(3), status_line), _int64(match.group(2), status_line), blocks


def _synced(line: str) -> int:
    """Blocks synced so far from a progress line; the other fields must parse too (procfs checks them all)."""
    match = _SYNCED.search(line)
    if match is None:
        raise MdstatError(f"mdstat: unexpected progress line {line.strip()[:100]!r}")
    synced = _int64(match.group(1), line)
    for pattern, strip in ((_PERCENT, True), (_FINISH, False), (_SPEED, False)):
        found = pattern.search(line)
        if found is None or parse_float_or_none(trim_space(found.group(1)) if strip else found.group(1)) is None:
            raise MdstatError(f"mdstat: unexpected progress line {line.strip()[:100]!r}")
    return synced


def parse_mdstat(text: str) -> list[MdArray]:
    """The arrays of /proc/mdstat: each ``mdN : state level members`` line and the two or three lines below it."""
    arrays: list[MdArray] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip() or line[0] == " " or line.startswith(("Personalities", "unused")):
            continue
        fields = line.split()
        if len(fields) < 3:
            raise MdstatError(f"mdstat: not enough fields in array line {line.strip()[:100]!r}")
        name, state = fields[0], fields[2]
        if len(lines) <= i + 3:
            raise MdstatError(f"mdstat: too few lines for {name}")
        active, total, blocks = _status(line, lines[i + 1])
        sync_line = lines[i + 3] if "bitmap" in lines[i + 2] else lines[i + 2]
        synced = blocks
        for word, running in (("recovery", "recovering"), ("check", "checking"), ("resync", "resyncing")):
            if word in sync_line:
                state = running
                break
        else:
            running = ""
        if running:
            # A pending or delayed resync has synced nothing yet and has no progress figures.
            synced = 0 if ("PENDING" in sync_line or "DELAYED" in sync_line) else _synced(sync_line)
        arrays.append(MdArray(name, state, active, total, line.count("(F)"), line.count("(S)"), blocks, synced))
    return arrays


def collect(ctx: NodeContext, out: list[Family]) -> None:
    arrays = parse_mdstat(ctx.read(ctx.proc("mdstat")))  # no /proc/mdstat: NoData, a failed collector
    required = gauge("node_md_disks_required", "Total number of disks of device.")
    disks = gauge("node_md_disks", "Number of active/failed/spare disks of device.")
    state = gauge("node_md_state", "Indicates the state of md-device.")
    blocks = gauge("node_md_blocks", "Total number of blocks on device.")
    synced = gauge("node_md_blocks_synced", "Number of blocks synced on device.")
    out += [required, disks, state, blocks, synced]
    for md in arrays:
        required.add(md.disks_total, device=md.name)
        disks.add(md.disks_active, device=md.name, state="active")
        disks.add(md.disks_failed, device=md.name, state="failed")
        disks.add(md.disks_spare, device=md.name, state="spare")
        for label, activity in STATES.items():
            state.add(1.0 if md.state == activity else 0.0, device=md.name, state=label)
        blocks.add(md.blocks, device=md.name)
        synced.add(md.blocks_synced, device=md.name)
