"""Go's duration grammar and time format (``nvdaemon.gotime``): tables of what Go's ``time.ParseDuration`` answers,
and hypothesis against integer arithmetic and exact decimals."""

from __future__ import annotations

import datetime as dt
import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.gotime import HOUR, MINUTE, SECOND, UNITS, DurationError, parse_duration, rfc3339

MAX = (1 << 63) - 1

# What Go's time.ParseDuration returns for these (its own test table, nanoseconds).
GO_ACCEPTS = [
    ("0", 0),
    ("5s", 5 * SECOND),
    ("30s", 30 * SECOND),
    ("1478s", 1478 * SECOND),
    ("-5s", -5 * SECOND),
    ("+5s", 5 * SECOND),
    ("-0", 0),
    ("+0", 0),
    ("5.0s", 5 * SECOND),
    ("5.6s", 5 * SECOND + 600_000_000),
    ("5.s", 5 * SECOND),
    (".5s", 500_000_000),
    ("1.0s", SECOND),
    ("1.00s", SECOND),
    ("1.004s", SECOND + 4_000_000),
    ("1.0040s", SECOND + 4_000_000),
    ("100.00100s", 100 * SECOND + 1_000_000),
    ("10ns", 10),
    ("11us", 11_000),
    ("12\u00b5s", 12_000),
    ("12\u03bcs", 12_000),
    ("13ms", 13_000_000),
    ("14s", 14 * SECOND),
    ("15m", 15 * MINUTE),
    ("16h", 16 * HOUR),
    ("3h30m", 3 * HOUR + 30 * MINUTE),
    ("10.5s4m", 4 * MINUTE + 10 * SECOND + 500_000_000),
    ("-2m3.4s", -(2 * MINUTE + 3 * SECOND + 400_000_000)),
    ("1h2m3s4ms5us6ns", HOUR + 2 * MINUTE + 3 * SECOND + 4_000_000 + 5_000 + 6),
    ("39h9m14.425s", 39 * HOUR + 9 * MINUTE + 14 * SECOND + 425_000_000),
    ("52763797000ns", 52_763_797_000),
    ("0.3333333333333333333h", 20 * MINUTE),
    ("9007199254740993ns", (1 << 53) + 1),
    ("9223372036854775807ns", MAX),
    ("9223372036854775.807us", MAX),
    ("9223372036s854ms775us807ns", MAX),
    ("-9223372036854775808ns", -(1 << 63)),
    ("-9223372036854775.808us", -(1 << 63)),
    ("0.100000000000000000000h", 6 * MINUTE),
    ("0.830103483285477580700h", 49 * MINUTE + 48 * SECOND + 372_539_827),
    ("90m", 90 * MINUTE),
    ("2h45m30s", 2 * HOUR + 45 * MINUTE + 30 * SECOND),
    ("1.5h", 90 * MINUTE),
    ("300ms", 300_000_000),
]

GO_REJECTS = [
    "",
    "3",
    "-",
    "s",
    ".",
    "-.",
    ".s",
    "+.s",
    "1d",
    "1w",
    "\x85\x85",
    "\xffff",
    "hello \xffff world",
    "9223372036854775808ns",
    "9223372036854775.808us",
    "9223372036854ms775us808ns",
    "-9223372036854775809ns",
    "1h 30m",
    " 1h",
    "1h ",
    "1H",
    "1..5h",
    "1.5.h",
    "--1h",
    "+-1h",
    "1_000s",
    "\u0661s",  # ARABIC-INDIC DIGIT ONE: Go reads bytes, only ASCII digits count
    "1e3s",
]


@pytest.mark.parametrize(("text", "nanos"), GO_ACCEPTS)
def test_what_go_accepts(text: str, nanos: int) -> None:
    assert parse_duration(text) == nanos


@pytest.mark.parametrize("text", GO_REJECTS)
def test_what_go_rejects(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_errors_say_what_is_wrong() -> None:
    with pytest.raises(DurationError, match="missing unit"):
        parse_duration("1h30")
    with pytest.raises(DurationError, match="unknown unit 'd'"):
        parse_duration("1d")


# ---- hypothesis -------------------------------------------------------------------------------------------------
unit = st.sampled_from(sorted(UNITS))
term = st.tuples(st.integers(0, 10**20), unit)
sign = st.sampled_from(["", "+", "-"])


@given(sign=sign, terms=st.lists(term, min_size=1, max_size=6))
def test_whole_terms_add_up_exactly_or_overflow(sign: str, terms: list[tuple[int, str]]) -> None:
    text = sign + "".join(f"{n}{u}" for n, u in terms)
    exact = sum(n * UNITS[u] for n, u in terms)
    limit = (1 << 63) if sign == "-" else MAX
    if exact > limit:
        with pytest.raises(DurationError):
            parse_duration(text)
    else:
        assert parse_duration(text) == (-exact if sign == "-" else exact)


@given(
    terms=st.lists(
        st.tuples(st.integers(0, 10**5), st.text("0123456789", min_size=1, max_size=12), unit), min_size=1, max_size=4
    )
)
def test_fractions_are_within_a_nanosecond_per_term_of_the_exact_decimal(terms: list[tuple[int, str, str]]) -> None:
    """Go scales a fraction in float64 and truncates: never more than the exact value, at most 1 ns per term less."""
    text = "".join(f"{n}.{frac}{u}" for n, frac, u in terms)
    exact = sum(Fraction(f"{n}.{frac}") * UNITS[u] for n, frac, u in terms)
    got = parse_duration(text)
    assert exact - len(terms) <= got <= exact + len(terms)


@given(nanos=st.integers(0, MAX))
def test_hours_minutes_and_nine_fraction_digits_round_trip(nanos: int) -> None:
    hours, rest = divmod(nanos, HOUR)
    minutes, rest = divmod(rest, MINUTE)
    seconds, fraction = divmod(rest, SECOND)
    assert parse_duration(f"{hours}h{minutes}m{seconds}.{fraction:09d}s") == nanos
    assert parse_duration(f"-{hours}h{minutes}m{seconds}.{fraction:09d}s") == -nanos


GRAMMAR = re.compile(r"[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)")
TERM = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def exact_magnitude(text: str) -> Fraction:
    return sum((Fraction(n if n != "." else "0") * UNITS[u] for n, u in TERM.findall(text)), Fraction(0))


@given(text=st.text(alphabet=st.sampled_from(list("0123456789.+-nsumh\u00b5\u03bcdx ")), max_size=24) | st.text())
def test_anything_is_a_duration_or_a_duration_error_as_the_grammar_says(text: str) -> None:
    try:
        got = parse_duration(text)
    except DurationError:
        # Refused: outside the grammar, or past 63 bits.
        assert GRAMMAR.fullmatch(text) is None or exact_magnitude(text) > MAX - 10
    else:
        assert GRAMMAR.fullmatch(text) is not None
        assert abs(abs(got) - exact_magnitude(text)) <= len(text)  # within a nanosecond per term


# ---- times ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (0.0, "1970-01-01T00:00:00Z"),
        (1_767_323_045.0, "2026-01-02T03:04:05Z"),
        (1_767_323_045.5, "2026-01-02T03:04:05.5Z"),
        (1_767_323_045.123456, "2026-01-02T03:04:05.123456Z"),
        (1_767_323_045.12, "2026-01-02T03:04:05.12Z"),
        (1_767_323_045.9999996, "2026-01-02T03:04:06Z"),  # rounds to the microsecond a float holds
    ],
)
def test_rfc3339_is_gos_rfc3339nano_in_utc(ts: float, text: str) -> None:
    assert rfc3339(ts) == text


GO_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{0,8}[1-9])?Z")


@given(ts=st.floats(0, 253_402_300_799, allow_nan=False))  # up to 9999-12-31T23:59:59Z, Go's last JSON year
def test_rfc3339_parses_back_to_the_same_microsecond(ts: float) -> None:
    text = rfc3339(ts)
    assert GO_TIME.fullmatch(text)  # the fraction, when there is one, trimmed of trailing zeros
    back = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert back == dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=round(ts * 1_000_000))
