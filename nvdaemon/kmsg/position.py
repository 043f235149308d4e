"""What the kernel-log source keeps in stateDir (``kmsg.json``): the boot it read, the last record's seq, and the XID
folds sent (so a storm going on across a restart of the agent stays one event).

Written atomically (``statefile.atomic_write``), and only once the events of the records up to ``seq`` are held by
every durable sink (``source.py``): a crash then reads some records again (at least once), never skips one.
"""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from nvdaemon.gpu.xid_ledger import XidFold
from nvdaemon.statefile import quarantine

log = logging.getLogger(__name__)

POSITION_FILE = "kmsg.json"


class KmsgPosition(msgspec.Struct):
    version: int = 1
    boot_id: str = ""  # "" = never read on this host
    seq: int = -1  # the last record read in that boot (-1: none)
    xid_folds: list[XidFold] = msgspec.field(default_factory=list)


def load_position(path: Path) -> KmsgPosition:
    """The saved position, or a fresh one; a damaged file is moved aside (never a crash loop)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return KmsgPosition()
    try:
        return msgspec.json.decode(data, type=KmsgPosition)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        quarantine(path, str(exc))
        return KmsgPosition()


def dump_position(pos: KmsgPosition) -> bytes:
    return msgspec.json.encode(pos)
