"""The NVIDIA driver's kernel log lines (nvdaemon/kmsg/gpu_lines.py): XIDs, NVLink5 XIDs, XID 154, NVSwitch SXIDs,
a GPU fallen off the bus (one line and three records) and the recovery signals, on lines as the driver prints
them (the examples NVSentinel's syslog-health-monitor and GPUd test their parsers with)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvdaemon.kmsg.gpu_lines import PREFILTER, FallenOffLines, GpuLine, parse_gpu_line
from nvdaemon.kmsg.record import parse_record, record_line

NVL5_149 = {
    "subcode": "NETIR_LINK_EVT",
    "link": "09",
    "severity": "Fatal",
    "intrinfo": "0x025525c6",
    "error_status": "0x00000000",
}

XID_LINES: list[tuple[str, GpuLine]] = [
    # standard XIDs, with and without pid/name, with a function in the address, and the minimal form
    (
        "NVRM: Xid (PCI:0000:b3:00.0): 79, pid=1234, name=process, Ch 00000001",
        GpuLine("xid", pci="0000:b3:00.0", code=79),
    ),
    (
        "NVRM: Xid (PCI:0000:66:00): 32, pid=2280636, name=train.3, Channel ID 0000000d intr0 00040000",
        GpuLine("xid", pci="0000:66:00", code=32),
    ),
    (
        "NVRM: Xid (PCI:0000:05:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        GpuLine("xid", pci="0000:05:00", code=79),
    ),
    ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.", GpuLine("xid", pci="0000:01:00", code=79)),
    ("NVRM: Xid (PCI:0000:3f:00): 46", GpuLine("xid", pci="0000:3f:00", code=46)),
    ("NVRM: Xid (PCI:0000:9b:00): 8, pid=5678, name=idle_timeout", GpuLine("xid", pci="0000:9b:00", code=8)),
    ("NVRM: Xid (PCI:0000:66:00): 999, pid=1234, name=test", GpuLine("xid", pci="0000:66:00", code=999)),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", GpuLine("xid", pci="0000:03:00", code=14)),  # no "PCI:"
    # with the kernel's timestamp in front (a journal or dmesg copy)
    (
        "[ 1843.308145] NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=x, An uncorrectable double bit error",
        GpuLine("xid", pci="0000:3b:00", code=48),
    ),
    # a 13 whose trailing text looks like an NVLink5 line gets no subcode: only 144-150 are decoded
    (
        "NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on "
        "(GPC 1, TPC 3, SM 0): Out Of Range Address",
        GpuLine("xid", pci="0000:b5:00", code=13),
    ),
    (
        "NVRM: Xid (PCI:0000:b5:00): 13, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 0x00000000)",
        GpuLine("xid", pci="0000:b5:00", code=13),
    ),
    (
        "NVRM: Xid (PCI:0003:00:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link "
        "14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        GpuLine("xid", pci="0003:00:00", code=74),
    ),
    # NVLink5 XIDs 144-150: the unit, severity, link and the first two registers
    (
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6 0x00000000 "
        "0x00000000 0x00000000 0x00000000 0x00000000)",
        GpuLine("xid", pci="0018:01:00", code=149, detail=NVL5_149),
    ),
    (
        "NVRM: Xid (PCI:0000:00:08.0): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 "
        "0x00000000 0x00000000 0x00000000)",
        GpuLine(
            "xid",
            pci="0000:00:08.0",
            code=145,
            detail={
                "subcode": "RLW_REMAP",
                "link": "10",
                "severity": "Nonfatal",
                "intrinfo": "0x00000082",
                "error_status": "0x00000040",
            },
        ),
    ),
    (
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 "
        "0x00000000 0x00000000)",
        GpuLine(
            "xid",
            pci="0019:01:00",
            code=149,
            detail={
                "subcode": "NETIR",
                "link": "-1",
                "severity": "Fatal",
                "intrinfo": "0x000fe406",
                "error_status": "0x00000000",
            },
        ),
    ),
    (
        "NVRM: Xid (PCI:0018:01:00): 145, pid=12, name=x, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 "
        "0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
        GpuLine(
            "xid",
            pci="0018:01:00",
            code=145,
            detail={
                "subcode": "RLW_RXPIPE",
                "link": "13",
                "severity": "Nonfatal",
                "intrinfo": "0x0409a0c2",
                "error_status": "0x00000008",
            },
        ),
    ),
    # a 144-150 without the NVLink5 tail is still that XID, without a subcode
    ("NVRM: Xid (PCI:0018:01:00): 150", GpuLine("xid", pci="0018:01:00", code=150)),
    # XID 154: a change to None is a recovery; to anything else it is the XID
    (
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
        GpuLine("recovered", pci="0008:01:00", code=154, signal="xid154"),
    ),
    (
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        GpuLine("xid", pci="0008:01:00", code=154),
    ),
    (
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        GpuLine("xid", pci="0008:01:00", code=154),
    ),
    ("NVRM: Xid (PCI:0000:01:00): 154 (", GpuLine("xid", pci="0000:01:00", code=154)),  # cut short: the XID
]

OTHER_LINES: list[tuple[str, GpuLine | None]] = [
    # NVSwitch SXIDs
    (
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error",
        GpuLine(
            "sxid",
            pci="0000:c3:00.0",
            code=24007,
            switch=0,
            fatal=True,
            detail={"message": "sourcetrack timeout error", "link": "30"},
        ),
    ),
    (
        "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
        GpuLine(
            "sxid",
            pci="0000:05:00.0",
            code=12028,
            switch=3,
            fatal=False,
            detail={"message": "egress non-posted PRIV error (First)", "link": "32"},
        ),
    ),
    (
        "[12.3] nvidia-nvswitch11: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 57 Minion Link DLREQ interrupt",
        GpuLine(
            "sxid",
            pci="0000:0a:00.0",
            code=22013,
            switch=11,
            detail={"message": "Minion Link DLREQ interrupt", "link": "57"},
        ),
    ),
    (
        "nvidia-nvswitch2: SXid (PCI:0000:c3:00.0): 12001, Non-fatal, Data parity error",  # no link named
        GpuLine("sxid", pci="0000:c3:00.0", code=12001, switch=2, detail={"message": "Data parity error"}),
    ),
    (
        "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 01234, Fatal, Link 30 x",  # the driver pads to 5 digits
        GpuLine("sxid", pci="0000:c3:00.0", code=1234, switch=0, fatal=True, detail={"message": "x", "link": "30"}),
    ),
    # fallen off the bus, the one-line form
    ("NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", GpuLine("fallen_off", pci="0000:18:00.0")),
    ("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus", GpuLine("fallen_off", pci="0000:01:00.0")),
    # recovery signals
    (
        "NVRM: GPU at PCI:0000:3b:00: GPU-6e5a2b1c-1111-2222-3333-444455556666",
        GpuLine(
            "recovered", pci="0000:3b:00", uuid="GPU-6e5a2b1c-1111-2222-3333-444455556666", signal="gpu_initialised"
        ),
    ),
    (
        "GPU reset executed: GPU-455d8f70-2051-db6c-0430-ffc457bff834, success: true",
        GpuLine("recovered", uuid="GPU-455d8f70-2051-db6c-0430-ffc457bff834", signal="reset_executed"),
    ),
    (
        "GPU reset executed: GPU-22222222-2222-2222-2222-222222222222",  # the older marker, written on success only
        GpuLine("recovered", uuid="GPU-22222222-2222-2222-2222-222222222222", signal="reset_executed"),
    ),
    ("GPU reset executed: GPU-455d8f70-2051-db6c-0430-ffc457bff834, success: false", None),
    # not XIDs, or malformed
    ("NVRM: Xid : 32, pid=2280636", None),  # no PCI address
    ("NVRM: Xid (PCI:0000:66:00): abc, pid=2280636", None),  # not a number
    ("NVRM: Xid (PCI:zzzz:66:00): 32", None),
    ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024", None),
    ("NVRM: The NVIDIA GPU 0000:b3:00.0", None),  # the first of three records: only FallenOffLines knows it
    ("NET: Registered protocol family 10", None),
    ("nvme nvme0: I/O 123 QID 4 timeout, aborting", None),
    ("", None),
]


@pytest.mark.parametrize(("text", "expected"), [*XID_LINES, *OTHER_LINES])
def test_parse_gpu_line(text: str, expected: GpuLine | None) -> None:
    assert parse_gpu_line(text) == expected


@pytest.mark.parametrize(("text", "expected"), [*XID_LINES, *OTHER_LINES])
def test_every_parsed_line_passes_the_prefilter(text: str, expected: GpuLine | None) -> None:
    # the source tries parse_gpu_line only on messages holding one of PREFILTER: it must never hide a line
    if expected is not None:
        assert any(p in text.encode() for p in PREFILTER)


THREE_RECORDS = (
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:26b5) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
)


def test_fallen_off_three_records() -> None:
    lines = FallenOffLines()
    got = [lines.feed(t) for t in THREE_RECORDS]
    assert got == [None, None, GpuLine("fallen_off", pci="0000:b3:00.0")]
    # the head is used once: a second tail alone is nothing
    assert lines.feed(THREE_RECORDS[2]) is None


@pytest.mark.parametrize(
    "records",
    [
        [THREE_RECORDS[2]],  # a tail without a head
        [THREE_RECORDS[1], THREE_RECORDS[2]],
        ["NVRM: fallen off the bus and is not responding to commands."] * 3,
    ],
)
def test_fallen_off_tail_without_head_gives_nothing(records: list[str]) -> None:
    lines = FallenOffLines()
    assert [lines.feed(t) for t in records] == [None] * len(records)


def test_fallen_off_a_later_head_replaces_the_first() -> None:
    lines = FallenOffLines()
    assert lines.feed("NVRM: The NVIDIA GPU 0000:b3:00.0") is None
    assert lines.feed("NVRM: The NVIDIA GPU 0000:18:00.0") is None
    assert lines.feed(THREE_RECORDS[2]) == GpuLine("fallen_off", pci="0000:18:00.0")


def test_fallen_off_one_record_with_embedded_newlines() -> None:
    rec = parse_record(record_line(3, 1, 1, "\n".join(THREE_RECORDS)))
    assert b"\\x0a" in rec.message
    # as the source does it: FallenOffLines first, then parse_gpu_line
    line = FallenOffLines().feed(rec.text) or parse_gpu_line(rec.text)
    assert line == GpuLine("fallen_off", pci="0000:b3:00.0")


@settings(max_examples=500, deadline=None)
@given(
    text=st.text()
    | st.builds(
        "".join,
        st.lists(
            st.sampled_from(
                [
                    "NVRM: Xid (PCI:",
                    "0000:3b:00",
                    ".0",
                    "): ",
                    "154",
                    "149",
                    ", ",
                    "pid=",
                    "name=",
                    " Fatal ",
                    "XC0 i0 Link ",
                    "(0x1 0x2",
                    "to 0x0 (None)",
                    "nvidia-nvswitch0: SXid (PCI:",
                    "Non-fatal",
                    "NVRM: GPU ",
                    "GPU reset executed: GPU-",
                    "abc",
                    " ",
                ]
            ),
            max_size=12,
        ),
    )
)
def test_parse_gpu_line_never_raises(text: str) -> None:
    line = parse_gpu_line(text)
    assert line is None or isinstance(line, GpuLine)
    FallenOffLines().feed(text)
