"""Kernel log records as ``/dev/kmsg`` gives them. Pure: no I/O.

The format (the kernel's Documentation/ABI/testing/dev-kmsg): one record per ``read()``,

    prio,seq,usec,flags[,more fields];message\\n
     KEY=value\\n        (zero or more continuation lines, each starting with a space)

``prio`` is facility * 8 + level; ``seq`` the record's sequence number, increasing by one per record since boot;
``usec`` microseconds since boot (the kernel's local clock) when it was logged; ``flags`` ``-`` or ``c``/``+``
(continuation, older kernels). Non-printable bytes and ``\\`` in the message are escaped as ``\\xNN``, so one record
is one line plus its continuation lines. A fixture host's ``dev/kmsg`` is a regular file of such records back to
back (``reader.py`` reads it line by line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_HEADER_FIELDS = 8  # prio, seq, usec, flags and a few the kernel may add (caller=T123 on some builds)


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One record: ``message`` is the raw bytes (still escaped); ``text`` decodes it when a rule matched."""

    seq: int
    usec: int
    prio: int
    message: bytes
    truncated: bool = False

    @property
    def facility(self) -> int:
        return self.prio >> 3

    @property
    def level(self) -> int:
        return self.prio & 7

    @property
    def text(self) -> str:
        return unescape(self.message)


class BadRecord(ValueError):
    """A record whose header is not ``prio,seq,usec,flags;`` (counted and skipped by the source)."""


def parse_record(raw: bytes, max_bytes: int = 8192) -> KmsgRecord:
    """One record's bytes (as one read of /dev/kmsg returns them) as a ``KmsgRecord``; ``BadRecord`` when its header
    is malformed. The message is cut at ``max_bytes`` (``truncated``); continuation lines are dropped (the
    dictionary of SUBSYSTEM=, DEVICE=: nothing a rule here reads)."""
    head, sep, rest = raw.partition(b";")
    if not sep:
        raise BadRecord("no ';' after the header")
    fields = head.split(b",", MAX_HEADER_FIELDS)
    if len(fields) < 4:
        raise BadRecord("fewer than 4 header fields")
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        raise BadRecord("prio, seq or usec is not a number") from None
    if prio < 0 or seq < 0 or usec < 0:
        raise BadRecord("negative prio, seq or usec")
    end = rest.find(b"\n")
    message = rest if end < 0 else rest[:end]
    truncated = len(message) > max_bytes
    if truncated:
        message = message[:max_bytes]
    return KmsgRecord(seq=seq, usec=usec, prio=prio, message=message, truncated=truncated)


_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


def unescape(message: bytes) -> str:
    """The message as text: ``\\xNN`` escapes turned back into their bytes, then UTF-8 with bad bytes replaced."""
    if b"\\x" in message:
        message = _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), message)
    return message.decode("utf-8", "replace")


def escape(text: str) -> bytes:
    """``text`` as the kernel writes it in a record: UTF-8, with every byte outside printable ASCII and ``\\`` as
    ``\\xNN`` (a prefilter literal is searched in the record's bytes, so it must be escaped the same way)."""
    return b"".join(bytes((b,)) if 0x20 <= b < 0x7F and b != 0x5C else b"\\x%02x" % b for b in text.encode("utf-8"))


def record_line(prio: int, seq: int, usec: int, message: str) -> bytes:
    """A record in the kernel's format (fixtures and tests write logs with it)."""
    return b"%d,%d,%d,-;%s\n" % (prio, seq, usec, escape(message))
