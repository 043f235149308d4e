"""goparse: the Go parser ports shared by the node_exporter collectors, table by table (and sysfs, procfs's
attribute reads built on them).

The tables gather the cases that each collector group kept for its own copy. Where the copies disagreed (``1_000``
for ParseFloat), the real node_exporter decides: it accepts ``MemTotal: 2_113_370_604 kB``, ``nr_free_pages
405_504_922``, ``26_784`` in file-nr and ``cpu0 6_660_235 0x1p3 ...`` in /proc/stat, so Go's underscore syntax
is accepted by ``parse_float`` (and so by fmt's ``%f``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from nvdaemon.collectors.base import HostRoots, NotPresent, ParseError
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.sysfs import read_int_file, sys_read_attr, sys_read_file
from nvdaemon.config import NodeExporterConfig
from nvdaemon.goparse import (
    GO_SPACE,
    MAX_LINE,
    fields,
    glob,
    parse_float,
    parse_float_or_none,
    parse_int,
    parse_uint,
    scan_lines,
    trim_space,
    wrap_int64,
)

# ---- strconv.ParseFloat ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        *[("45000", 45000.0), ("-273150", -273150.0), ("1.5", 1.5), (".5", 0.5), ("1.", 1.0), ("5.", 5.0)],
        *[("0", 0.0), ("7200", 7200.0), ("12", 12.0), ("-1", -1.0), ("2367057006", 2367057006.0)],
        *[("1e3", 1000.0), ("+2E-2", 0.02), ("-1.5e3", -1500.0), ("1e-400", 0.0)],  # underflow is no error in Go
        *[("0x1p4", 16.0), ("0X.8P1", 1.0), ("0x1p-2", 0.25)],
        *[("Inf", math.inf), ("+Inf", math.inf), ("-infinity", -math.inf)],
        *[("1_000", 1000.0), ("1_0", 10.0), ("1_000.5e1_0", 1000.5e10), ("0x_1p4", 16.0)],  # Go's literal syntax
    ],
)
def test_parse_float_accepts(text: str, want: float) -> None:
    assert parse_float(text) == want
    assert parse_float_or_none(text) == want


def test_parse_float_nan() -> None:
    assert math.isnan(parse_float("NaN"))
    assert math.isnan(parse_float("nan"))


@pytest.mark.parametrize(
    "text",
    [
        *["", " 1", "1 ", " 45000", "45000 ", "1\r"],  # Go takes no surrounding space
        *["1__0", "1_.5", "1e_1", "_1", "1_"],  # "_" only between digits
        *["95.0%", "N/A", "yes", "abc", "1,5", "infin", "--1", "+nan", "-nan"],
        *["0x10", "0x1"],  # a hex float needs its p exponent
        *["1e400", "0x1p99999"],  # overflow is an error, not infinity
        *["١٢", "١"],  # Python's float() takes non-ASCII digits
    ],
)
def test_parse_float_refuses(text: str) -> None:
    with pytest.raises(ParseError):
        parse_float(text)
    assert parse_float_or_none(text) is None


# ---- strconv.ParseInt / ParseUint --------------------------------------------------------------------------------

ParseFn = Callable[..., int]


@pytest.mark.parametrize(
    ("fn", "text", "kwargs", "want"),
    [
        (parse_int, "42", {}, 42),
        (parse_int, "-1", {}, -1),
        (parse_int, "+7", {}, 7),
        (parse_int, "9223372036854775807", {}, (1 << 63) - 1),
        (parse_int, "0" * 100 + "1", {}, 1),
        (parse_uint, "0", {}, 0),
        (parse_uint, "18446744073709551615", {}, (1 << 64) - 1),
        (parse_uint, "ff", {"base": 16}, 255),
        (parse_uint, "0000001a", {"base": 16, "bits": 32}, 26),
        (parse_int, "0x1003", {"base": 0}, 0x1003),
        (parse_int, "0x1F", {"base": 0}, 31),
        (parse_int, "0o17", {"base": 0}, 15),
        (parse_int, "017", {"base": 0}, 15),  # a bare leading 0 is octal in base 0
        (parse_int, "010", {"base": 0}, 8),
        (parse_int, "0b101", {"base": 0}, 5),
        (parse_int, "1_000", {"base": 0}, 1000),
        (parse_int, "-0x_10", {"base": 0}, -16),
        (parse_int, "-1", {"base": 0}, -1),
        (parse_int, "0", {"base": 0}, 0),
    ],
)
def test_parse_integer_accepts(fn: ParseFn, text: str, kwargs: dict[str, int], want: int) -> None:
    assert fn(text, **kwargs) == want


@pytest.mark.parametrize(
    ("fn", "text", "kwargs"),
    [
        (parse_int, "", {}),
        (parse_uint, "", {}),
        (parse_uint, " 1", {}),
        (parse_uint, "1 ", {}),
        (parse_int, "12 ", {}),
        (parse_uint, "-1", {}),  # ParseUint takes no sign
        (parse_uint, "+1", {}),
        (parse_int, "9223372036854775808", {}),
        (parse_uint, "18446744073709551616", {}),
        (parse_int, "1" * 500, {}),
        (parse_uint, "1_000", {}),  # underscores only in base 0
        (parse_int, "1_000", {}),
        (parse_uint, "0x10", {"base": 16}),  # no prefix with an explicit base
        (parse_int, "0x1F", {}),
        (parse_uint, "100000000", {"base": 16, "bits": 32}),
        (parse_uint, "٣", {}),  # a non-ASCII digit
        (parse_int, "9223372036854775808", {"base": 0}),
        (parse_int, "08", {"base": 0}),
        (parse_int, "1__0", {"base": 0}),
        (parse_int, "_1", {"base": 0}),
        (parse_int, "1_", {"base": 0}),
        (parse_int, "0x", {"base": 0}),
    ],
)
def test_parse_integer_refuses(fn: ParseFn, text: str, kwargs: dict[str, int]) -> None:
    with pytest.raises(ParseError):
        fn(text, **kwargs)


# ---- bufio.Scanner, strings.TrimSpace, strings.Fields -------------------------------------------------------------


def test_scan_lines_is_bufio_scanner() -> None:
    assert scan_lines("a\r\nb\n") == ["a", "b"]
    assert scan_lines("a\n\nb") == ["a", "", "b"]
    assert scan_lines("a\x0cb\n") == ["a\x0cb"]  # only \n splits
    assert scan_lines("") == []


def test_scan_lines_token_too_long() -> None:
    text = "x" * MAX_LINE + "\n"
    assert scan_lines(text) == ["x" * MAX_LINE]  # no limit unless the caller names its file
    with pytest.raises(ParseError, match="/proc/stat: line longer"):
        scan_lines(text, path="/proc/stat")


def test_trim_space_keeps_ascii_separators() -> None:
    assert trim_space("\t x86_pkg_temp\n\xa0") == "x86_pkg_temp"
    assert trim_space("\x1cname\x1f") == "\x1cname\x1f"  # Python's strip() would drop them
    assert "\x1c" not in GO_SPACE and "\u3000" in GO_SPACE


def test_fields_is_strings_fields() -> None:
    assert fields(" cpu0\t1 \u20032\x1c ") == ["cpu0", "1", "2\x1c"]


def test_wrap_int64_is_go_int64_arithmetic() -> None:
    assert wrap_int64(5) == 5 and wrap_int64(-5) == -5
    assert wrap_int64((1 << 63) - 1) == (1 << 63) - 1
    assert wrap_int64(1 << 63) == -(1 << 63)
    assert wrap_int64((1 << 64) + 7) == 7


# ---- filepath.Glob ------------------------------------------------------------------------------------------------


def test_glob_is_filepath_glob(tmp_path: Path) -> None:
    for name in ("cpu10", "cpu2", "cpu1", "cpufreq", "cpu", "xcpu1"):
        (tmp_path / name).mkdir()
    got = glob(tmp_path, re.compile(r"cpu[0-9].*", re.DOTALL))
    assert [p.name for p in got] == ["cpu1", "cpu10", "cpu2"]  # byte order, whole-name match
    assert all(p.parent == tmp_path for p in got)
    assert glob(tmp_path / "absent", re.compile(".*")) == []  # an unreadable directory matches nothing


# ---- procfs's sysfs reads -----------------------------------------------------------------------------------------


def _ctx(root: Path) -> NodeContext:
    return NodeContext(HostRoots.under(root), NodeExporterConfig())


def test_sysfs_reads_one_128_byte_buffer_and_trims_as_go(tmp_path: Path) -> None:
    (tmp_path / "long").write_text("M" * 200 + "\n")
    (tmp_path / "padded").write_text("\x1c SAMSUNG  \n")
    ctx = _ctx(tmp_path)
    assert sys_read_file(ctx, tmp_path / "long") == "M" * 128
    assert sys_read_file(ctx, tmp_path / "padded") == "\x1c SAMSUNG  \n"  # untrimmed
    assert sys_read_attr(ctx, tmp_path / "padded") == "\x1c SAMSUNG"  # TrimSpace keeps \x1c
    with pytest.raises(NotPresent):
        sys_read_attr(ctx, tmp_path / "absent")


def test_read_int_file(tmp_path: Path) -> None:
    for name, text in (("u", " 42\n"), ("s", "-5\n"), ("bad", "0x10\n")):
        (tmp_path / name).write_text(text)
    ctx = _ctx(tmp_path)
    assert read_int_file(ctx, tmp_path / "u") == 42
    assert read_int_file(ctx, tmp_path / "s", signed=True) == -5
    with pytest.raises(ParseError, match=r"/s: strconv\.ParseUint"):  # unsigned by default; the file is named
        read_int_file(ctx, tmp_path / "s")
    with pytest.raises(ParseError, match="/bad: "):
        read_int_file(ctx, tmp_path / "bad")
