"""Go's text and number parsers, as node_exporter (and its procfs/sysfs library) uses them.

Whether a node_exporter collector succeeds, fails, or skips a file depends on exactly what Go's parsers accept, and
they are stricter (and in places looser) than Python's: ``strconv.ParseInt`` takes no surrounding space and no
Unicode digits, ``ParseFloat`` takes ``1_000.5`` and ``0x1p-2`` but errs on a finite literal that overflows,
``strings.TrimSpace`` keeps the ASCII separators \\x1c-\\x1f that ``str.strip`` drops. The collectors use these
ports so that their verdicts agree with node_exporter's. Each function names the Go function it reproduces; every
parser raises ``ParseError`` (a ``ValueError``) where Go returns an error.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path


class ParseError(ValueError):
    """A file had content the parser could not understand; the message names the file and what was wrong."""


# Go's unicode.IsSpace: Python's str.isspace() set less the four ASCII separators \x1c-\x1f.
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
MAX_LINE = 64 * 1024  # bufio.Scanner's default token limit: a longer line stops the scan ("token too long")

_FIELD_SPLIT = re.compile(f"[{GO_SPACE}]+")
# strconv.ParseFloat's decimal and hexadecimal syntax once the "_" separators are checked and removed, and its
# special words: "inf"/"infinity" with an optional sign and an unsigned "nan", in any case.
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_HEX_FLOAT = re.compile(r"[+-]?0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+", re.ASCII)
_INF = re.compile(r"[+-]?(?:inf|infinity)", re.ASCII | re.IGNORECASE)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_PREFIX_BASE = {"b": 2, "o": 8, "x": 16}


def trim_space(text: str) -> str:
    """``strings.TrimSpace`` (and ``bytes.TrimSpace``)."""
    return text.strip(GO_SPACE)


def fields(line: str) -> list[str]:
    """``strings.Fields``."""
    if line.isascii() and line.isprintable():  # the common case: the only Go space in printable ASCII is " "
        return [f for f in line.split(" ") if f]
    return [f for f in _FIELD_SPLIT.split(line) if f]


def scan_lines(text: str, *, path: str | None = None) -> list[str]:
    """The lines ``bufio.Scanner`` yields: split on ``\\n`` only, one trailing ``\\r`` dropped, no empty tail.

    With ``path``, a line of ``MAX_LINE`` bytes or more is the scanner's ``ErrTooLong``, raised as ``ParseError``.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if path is not None and any(len(line.encode()) >= MAX_LINE for line in lines):
        raise ParseError(f"{path}: line longer than {MAX_LINE} bytes")
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def glob(directory: Path, pattern: re.Pattern[str]) -> list[Path]:
    """``filepath.Glob(directory/<pattern>)``: matching entries in byte order; an unreadable directory is none."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / n for n in sorted(names, key=os.fsencode) if pattern.fullmatch(n)]


def glob_strings(directory: str, pattern: re.Pattern[str]) -> list[str]:
    """``glob`` on strings (``directory/name``): cheaper where the caller builds paths as strings."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [f"{directory}/{n}" for n in sorted(names, key=os.fsencode) if pattern.fullmatch(n)]


def _underscores_ok(body: str, prefixed: bool, hexadecimal: bool) -> bool:
    """strconv's ``underscoreOK`` on a number without its sign (and without its base prefix when ``prefixed``):
    ``_`` only between digits, where a base prefix counts as a digit."""
    saw = "0" if prefixed else "^"
    for ch in body:
        if ch in "0123456789" or (hexadecimal and ch.lower() in "abcdef"):
            saw = "0"
        elif ch == "_":
            if saw != "0":
                return False
            saw = "_"
        else:
            if saw == "_":
                return False
            saw = "!"
    return saw != "_"


def parse_float(text: str) -> float:
    """``strconv.ParseFloat(text, 64)``: Go's float literal syntax (decimal, ``0x`` hex with a ``p`` exponent,
    ``_`` between digits), inf/infinity with a sign, unsigned nan; an overflow to infinity is an error."""
    # The common case, an optionally negative run of decimal digits (a sensor reading): float() agrees with Go;
    # 300 digits stay below the largest float.
    if text.isascii() and len(text) < 300 and (text[1:] if text[:1] == "-" else text).isdigit():
        return float(text)
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    if text.lower() == "nan":  # Go takes no sign on NaN
        return math.nan
    if "_" in text:
        body = text[1:] if text[:1] in ("+", "-") else text
        hexadecimal = body[:2].lower() == "0x"
        if not _underscores_ok(body[2:] if hexadecimal else body, hexadecimal, hexadecimal):
            raise ParseError(f"strconv.ParseFloat: parsing {text[:40]!r}: invalid syntax")
        text = text.replace("_", "")
    try:
        if _DECIMAL.fullmatch(text):
            value = float(text)
        elif _HEX_FLOAT.fullmatch(text):
            value = float.fromhex(text)
        else:
            raise ParseError(f"strconv.ParseFloat: parsing {text[:40]!r}: invalid syntax")
    except OverflowError:  # float.fromhex on a huge exponent
        value = math.inf
    if math.isinf(value):  # Go answers ErrRange where Python rounds to infinity
        raise ParseError(f"strconv.ParseFloat: parsing {text[:40]!r}: value out of range")
    return value


def parse_float_or_none(text: str) -> float | None:
    """``strconv.ParseFloat(text, 64)`` for callers that only skip what Go refuses: ``None`` where Go errs."""
    try:
        return parse_float(text)
    except ParseError:
        return None


def _parse_integer(text: str, base: int, bits: int, signed: bool) -> int:
    # The common case, plain decimal digits that fit any 64-bit range (at most 18 of them): int() alone agrees
    # with Go. Base 0 reads a leading 0 as octal, so only a digit string without one takes this path there.
    if (
        bits == 64
        and text.isdigit()
        and text.isascii()
        and len(text) <= 18
        and (base == 10 or (base == 0 and (text[0] != "0" or text == "0")))
    ):
        return int(text)
    name = "ParseInt" if signed else "ParseUint"
    sign, body = (text[0], text[1:]) if signed and text[:1] in ("+", "-") else ("", text)
    base0, prefixed = base == 0, False
    if base0:  # the prefix picks the base; a bare leading 0 is octal (and stays a digit)
        base = 10
        if body[:1] == "0":
            if len(body) >= 3 and body[1].lower() in _PREFIX_BASE:
                base, body, prefixed = _PREFIX_BASE[body[1].lower()], body[2:], True
            else:
                base = 8
    if base0 and "_" in body:  # "_" separators only in base 0
        if not _underscores_ok(body, prefixed, base == 16):
            raise ParseError(f"strconv.{name}: parsing {text[:40]!r}: invalid syntax")
        body = body.replace("_", "")
    if not body or not body.isascii() or any(ch not in _DIGITS[:base] for ch in body.lower()):
        raise ParseError(f"strconv.{name}: parsing {text[:40]!r}: invalid syntax")
    if len(body.lstrip("0")) > 64:  # past 64 bits in any base; int() refuses very long digit strings
        raise ParseError(f"strconv.{name}: parsing {text[:40]!r}: value out of range")
    value = int(body, base) * (-1 if sign == "-" else 1)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise ParseError(f"strconv.{name}: parsing {text[:40]!r}: value out of range")
    return value


def parse_int(text: str, base: int = 10, bits: int = 64) -> int:
    """``strconv.ParseInt(text, base, bits)`` (``strconv.Atoi`` is base 10, 64 bits): an optional sign, then digits
    of ``base``; base 0 infers it from a 0x/0o/0b or bare 0 prefix and allows ``_`` between digits."""
    return _parse_integer(text, base, bits, signed=True)


def parse_uint(text: str, base: int = 10, bits: int = 64) -> int:
    """``strconv.ParseUint(text, base, bits)``: as ``parse_int`` without a sign."""
    return _parse_integer(text, base, bits, signed=False)


def wrap_int64(value: int) -> int:
    """Go's int64 arithmetic on ``value``: two's complement, wrapped to 64 bits."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value
