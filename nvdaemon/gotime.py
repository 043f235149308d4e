"""Go's time formats, where a Go agent's client meets ours: durations as Go's ``time.ParseDuration`` reads them, and
times as Go's ``time.Time`` writes them in JSON. Pure functions, no I/O.

Durations (``parse_duration``): ``[-+]?([0-9]*(\\.[0-9]*)?UNIT)+`` with the units ``ns``, ``us`` (also ``µs`` U+00B5
and ``μs`` U+03BC), ``ms``, ``s``, ``m``, ``h``, or the bare ``0``; every term needs a digit and a unit; the total is
whole nanoseconds in a signed 64-bit integer, and more is an error, as in Go. A fraction is scaled in float64 and
truncated (``1.5h`` is exact; digits past what 63 bits hold are ignored), so the result is Go's to the nanosecond.

Times (``rfc3339``): Go's ``RFC3339Nano`` layout in UTC, fraction digits trimmed of trailing zeros (none at all on a
whole second): ``2026-01-02T03:04:05.123456Z``, ``2026-01-02T03:05:00Z``. Our times are float seconds, which hold
microseconds, so at most six digits are written; Go's ``time.Time`` reads any count from one to nine.
"""

from __future__ import annotations

import functools
import time

NANOSECOND = 1
MICROSECOND = 1000 * NANOSECOND
MILLISECOND = 1000 * MICROSECOND
SECOND = 1000 * MILLISECOND
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE

UNITS = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # MICRO SIGN
    "\u03bcs": MICROSECOND,  # GREEK SMALL LETTER MU
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}
_LIMIT = 1 << 63  # magnitudes above it overflow Go's int64 nanoseconds (exactly it only as a negative total)


class DurationError(ValueError):
    """Text that Go's ``time.ParseDuration`` refuses."""


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"  # ASCII only: Go reads bytes, so no other script's digits count


def _digits(text: str, pos: int) -> int:
    end = pos
    while end < len(text) and _is_digit(text[end]):
        end += 1
    return end


def _fraction(digits: str) -> tuple[int, float]:
    """The fraction's digits as an integer and its scale (10 per digit kept); digits past 63 bits are dropped."""
    value, scale = 0, 1.0
    for c in digits:
        nxt = value * 10 + ord(c) - 48
        if value > (_LIMIT - 1) // 10 or nxt > _LIMIT:
            break
        value, scale = nxt, scale * 10
    return value, scale


def parse_duration(text: str) -> int:
    """Nanoseconds, signed; ``DurationError`` for anything Go's ``time.ParseDuration`` rejects."""
    invalid = DurationError(f"invalid duration {text!r}")
    rest, negative = text, False
    if rest[:1] in ("-", "+"):
        negative, rest = rest[0] == "-", rest[1:]
    if rest == "0":
        return 0
    if rest == "":
        raise invalid
    total, pos = 0, 0
    while pos < len(rest):
        if not (rest[pos] == "." or _is_digit(rest[pos])):
            raise invalid
        int_end = _digits(rest, pos)
        whole = rest[pos:int_end]
        frac_end = int_end
        if frac_end < len(rest) and rest[frac_end] == ".":
            frac_end = _digits(rest, frac_end + 1)
            frac_digits = rest[int_end + 1 : frac_end]
        else:
            frac_digits = ""
        if not whole and not frac_digits:
            raise invalid  # ".s", "-.h": a term without a digit
        unit_end = frac_end
        while unit_end < len(rest) and not (rest[unit_end] == "." or _is_digit(rest[unit_end])):
            unit_end += 1
        unit_text = rest[frac_end:unit_end]
        if not unit_text:
            raise DurationError(f"missing unit in duration {text!r}")
        unit = UNITS.get(unit_text)
        if unit is None:
            raise DurationError(f"unknown unit {unit_text!r} in duration {text!r}")
        value = int(whole) if whole else 0  # ASCII digits only, checked above
        if value > _LIMIT or value > _LIMIT // unit:
            raise invalid
        value *= unit
        numerator, scale = _fraction(frac_digits)
        if numerator > 0:
            value += int(float(numerator) * (float(unit) / scale))  # float64 and truncation, as Go does
            if value > _LIMIT:
                raise invalid
        total += value
        if total > _LIMIT:
            raise invalid
        pos = unit_end
    if negative:
        return -total
    if total > _LIMIT - 1:
        raise invalid
    return total


@functools.lru_cache(maxsize=4096)
def _date(day: int) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day * 86400))


def rfc3339(ts: float) -> str:
    """Seconds since the epoch as Go's ``time.Time`` marshals a UTC time (see the module docstring)."""
    seconds, fraction = divmod(round(ts * 1_000_000), 1_000_000)
    day, second = divmod(seconds, 86400)
    hour, second = divmod(second, 3600)
    minute, second = divmod(second, 60)
    # The date is cached per day: a long history answer formats 200,000 times of a few hundred days.
    text = f"{_date(day)}T{hour:02d}:{minute:02d}:{second:02d}"
    if fraction:
        text += "." + f"{fraction:06d}".rstrip("0")
    return text + "Z"
