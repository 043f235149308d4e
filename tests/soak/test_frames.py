"""How the soak's never-reading client reads the server's frames (``close_code``, ``frame_summary``): the close
frame is found after data frames of every length form, and a connection that ended inside a frame says so."""

from __future__ import annotations

import struct

import pytest

from bench.soak.clients import close_code, frame_summary


def frame(opcode: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n])
    elif n < 1 << 16:
        head = bytes([0x80 | opcode, 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x80 | opcode, 127]) + struct.pack("!Q", n)
    return head + payload


DATA = frame(1, b"x" * 5) + frame(1, b"y" * 300) + frame(1, b"z" * 70_000)
CLOSE = frame(8, struct.pack("!H", 1013))


def test_the_close_frame_after_data_frames_of_every_length_form() -> None:
    assert close_code(DATA + CLOSE) == "close:1013"
    assert frame_summary(DATA + CLOSE).endswith("4 whole frames (opcodes [1, 8]), ending on a frame boundary")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (DATA, "3 whole frames (opcodes [1]), ending on a frame boundary"),
        (DATA[:-10], "2 whole frames (opcodes [1]), then one cut short"),
        (DATA[:3], "0 whole frames (opcodes []), then one cut short"),
        (DATA + b"\x88", "3 whole frames (opcodes [1]), ending on 1 stray bytes"),
    ],
)
def test_bytes_without_a_close_frame_are_described(data: bytes, says: str) -> None:
    assert close_code(data) is None
    assert frame_summary(data) == f"{len(data)} bytes, {says}"
