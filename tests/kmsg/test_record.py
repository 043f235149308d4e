"""``/dev/kmsg`` records (nvdaemon/kmsg/record.py): the header, continuation lines, escapes, truncation, malformed
headers and the facility/level split, on the kernel's own examples (Documentation/ABI/testing/dev-kmsg)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvdaemon.kmsg.record import BadRecord, KmsgRecord, parse_record, record_line, unescape


@pytest.mark.parametrize(
    ("raw", "seq", "usec", "prio", "message"),
    [
        (
            b"6,339,5140900,-;NET: Registered protocol family 10\n",
            339,
            5140900,
            6,
            b"NET: Registered protocol family 10",
        ),
        (b"30,340,5690716,-;udevd[80]: starting version 181\n", 340, 5690716, 30, b"udevd[80]: starting version 181"),
        # continuation lines (the dictionary) come in the same read and are dropped
        (
            b"7,160,424069,-;pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)\n"
            b" SUBSYSTEM=acpi\n DEVICE=+acpi:PNP0A03:00\n",
            160,
            424069,
            7,
            b"pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)",
        ),
        # CONFIG_PRINTK_CALLER adds a field; future kernels may add more: ignored
        (b"4,12,3000,-,caller=T123;hello\n", 12, 3000, 4, b"hello"),
        (b"4,12,3000,c,caller=C2,more=1,x;hello\n", 12, 3000, 4, b"hello"),
        # no trailing newline (a read() buffer cut short), and an empty message
        (b"3,1,2,-;no newline", 1, 2, 3, b"no newline"),
        (b"3,1,2,-;\n", 1, 2, 3, b""),
        # a ';' inside the message belongs to the message
        (b"6,5,6,-;a;b;c\n", 5, 6, 6, b"a;b;c"),
    ],
)
def test_parse_real_records(raw: bytes, seq: int, usec: int, prio: int, message: bytes) -> None:
    rec = parse_record(raw)
    assert rec == KmsgRecord(seq=seq, usec=usec, prio=prio, message=message, truncated=False)


@pytest.mark.parametrize(
    ("prio", "facility", "level"),
    [
        (0, 0, 0),  # kernel, emerg
        (6, 0, 6),  # kernel, info
        (11, 1, 3),  # userspace write "<3>text": facility LOG_USER (1), level 3
        (14, 1, 6),
        (30, 3, 6),  # daemon, info (the kernel doc's udevd line)
        (191, 23, 7),  # local7, debug
    ],
)
def test_facility_and_level_from_prio(prio: int, facility: int, level: int) -> None:
    rec = parse_record(b"%d,1,1,-;x\n" % prio)
    assert (rec.facility, rec.level) == (facility, level)


@pytest.mark.parametrize(
    ("escaped", "text"),
    [
        (b"C:\\x5cwindows", "C:\\windows"),  # the backslash itself
        (b"line one\\x0aline two", "line one\nline two"),  # an embedded newline
        (b"caf\\xc3\\xa9", "caf\u00e9"),  # UTF-8, one escape per byte
        (b"tab\\x09here", "tab\there"),
        (b"\\X41 is not an escape", "\\X41 is not an escape"),  # only lower-case \x
        (b"\\x4", "\\x4"),  # too short: left as is
        (b"bad \\xff byte", "bad \ufffd byte"),  # not UTF-8: replaced, not raised
    ],
)
def test_unescape(escaped: bytes, text: str) -> None:
    assert unescape(escaped) == text
    assert parse_record(b"6,1,1,-;" + escaped + b"\n").text == text


def test_record_line_escapes_as_the_kernel_does() -> None:
    assert record_line(6, 7, 8, "a\\b\nc\u00e9") == b"6,7,8,-;a\\x5cb\\x0ac\\xc3\\xa9\n"
    assert record_line(11, 0, 0, "plain text") == b"11,0,0,-;plain text\n"


@settings(max_examples=300, deadline=None)
@given(
    message=st.text(),  # no surrogates by default: every one is encodable, as all kernel text is
    prio=st.integers(0, 191),
    seq=st.integers(0, 2**63),
    usec=st.integers(0, 2**63),
)
def test_record_line_round_trips_any_message(message: str, prio: int, seq: int, usec: int) -> None:
    raw = record_line(prio, seq, usec, message)
    assert raw.count(b"\n") == 1  # one record is one line
    rec = parse_record(raw, max_bytes=len(raw))
    assert (rec.prio, rec.seq, rec.usec, rec.text, rec.truncated) == (prio, seq, usec, message, False)


@pytest.mark.parametrize(
    ("message", "max_bytes", "kept", "truncated"),
    [
        (b"x" * 100, 100, b"x" * 100, False),  # exactly at the limit: whole
        (b"x" * 101, 100, b"x" * 100, True),
        (b"abcdef", 3, b"abc", True),
        (b"", 1, b"", False),
    ],
)
def test_truncation_at_max_bytes(message: bytes, max_bytes: int, kept: bytes, truncated: bool) -> None:
    rec = parse_record(b"6,1,1,-;" + message + b"\n SUBSYSTEM=x\n", max_bytes=max_bytes)
    assert (rec.message, rec.truncated) == (kept, truncated)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\n",
        b"6,339,5140900,- NET: no separator\n",  # no ';'
        b"6,339,5140900;too few fields\n",
        b"6,339;too few\n",
        b";nothing\n",
        b"x,339,5140900,-;prio not a number\n",
        b"6,abc,5140900,-;seq not a number\n",
        b"6,339,1.5,-;usec not an integer\n",
        b"6,,5140900,-;empty seq\n",
        b"-1,339,5140900,-;negative prio\n",
        b"6,-339,5140900,-;negative seq\n",
        b"6,339,-1,-;negative usec\n",
        b" SUBSYSTEM=acpi\n",  # a continuation line alone
    ],
)
def test_malformed_headers_raise_bad_record(raw: bytes) -> None:
    with pytest.raises(BadRecord):
        parse_record(raw)


def test_bad_record_is_a_value_error() -> None:
    assert issubclass(BadRecord, ValueError)


@settings(max_examples=500, deadline=None)
@given(raw=st.binary(max_size=300) | st.builds(lambda h, m: h + b";" + m, st.binary(max_size=40), st.binary()))
def test_parse_record_raises_only_bad_record(raw: bytes) -> None:
    try:
        rec = parse_record(raw, max_bytes=64)
    except BadRecord:
        return
    assert min(rec.prio, rec.seq, rec.usec) >= 0
    assert len(rec.message) <= 64
    assert b"\n" not in rec.message
    assert isinstance(rec.text, str)
