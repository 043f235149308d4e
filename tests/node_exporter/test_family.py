"""The text encoder of the node_* surface: Go's float layout, escaping, and summary/histogram suffixes."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.compat.node_exporter.family import Family, go_float, merge, render


def reference(value: float) -> str:
    """Go's FormatFloat(v, 'g', -1, 64) computed another way (Decimal), to hold the fast path to."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digit_tuple, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple))
    exp = len(digits) + exponent - 1
    prefix = "-" if sign else ""
    if exp < -4 or exp >= 6:
        lead = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{lead}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    return prefix + format(Decimal(repr(abs(value))).normalize(), "f")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (999999.0, "999999"),
        (1e6, "1e+06"),
        (1.6647749632e10, "1.6647749632e+10"),
        (123456.75, "123456.75"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (-3.5e-7, "-3.5e-07"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_go_float_table(value: float, text: str) -> None:
    assert go_float(value) == text


@given(
    st.one_of(
        st.floats(), st.integers(-(10**20), 10**20).map(float), st.integers(-(10**8), 10**8).map(lambda i: i / 1000)
    )
)
def test_go_float_matches_the_reference(value: float) -> None:
    assert go_float(value) == reference(value)


def test_render_sorts_escapes_and_moves_suffixes_back() -> None:
    fam = Family("x_seconds", 'time\nwith "quotes" \\ here', "histogram")
    fam.add_suffixed("_bucket", 2, {"path": 'a"b\\c\nd', "le": "+Inf"})
    fam.add_suffixed("_sum", 1.5, {"path": 'a"b\\c\nd'})
    fam.add_suffixed("_count", 2, {"path": 'a"b\\c\nd'})
    text = render({"x_seconds": fam, "empty": Family("empty", "no samples")}).decode()
    assert text == (
        '# HELP x_seconds time\\nwith "quotes" \\\\ here\n'
        "# TYPE x_seconds histogram\n"
        'x_seconds_bucket{le="+Inf",path="a\\"b\\\\c\\nd"} 2\n'
        'x_seconds_count{path="a\\"b\\\\c\\nd"} 2\n'
        'x_seconds_sum{path="a\\"b\\\\c\\nd"} 1.5\n'
    )


@pytest.mark.parametrize(("value", "text"), [(44445, "44445"), (7 * 10**9, "7e+09"), (-2, "-2")])
def test_go_float_takes_ints(value: int, text: str) -> None:
    assert go_float(value) == text


def test_render_moves_suffixes_of_samples_joined_from_another_family() -> None:
    # textfile joins the samples of one family read from several files: the first copy may have had none.
    first, later = Family("h", "x", "histogram"), Family("h", "x", "histogram")
    later.add_suffixed("_count", 3, {"job": "a"})
    first.samples.extend(later.samples)
    merged = merge([Family("g", "y", "gauge"), first])
    assert render(merged).decode().splitlines()[-1] == 'h_count{job="a"} 3'


def test_render_keeps_the_first_of_duplicate_series() -> None:
    fam = Family("d", "dup").add(1, device="a").add(2, device="b").add(3, device="a")
    assert render({"d": fam}).decode().splitlines()[2:] == ['d{device="a"} 1', 'd{device="b"} 2']


def test_render_writes_values_as_go_float_does() -> None:
    # render formats the common integer values itself; every value must still read as go_float writes it.
    values = [0.0, -0.0, 7.0, -3.0, 999999.0, 1e6, -1e6, 2.0**53, 0.25, 1e-5, math.nan, math.inf, -math.inf]
    fam = Family("v", "values")
    for i, value in enumerate(values):
        fam.add(value, i=f"{i:02d}")
    lines = render({"v": fam}).decode().splitlines()[2:]
    assert lines == [f'v{{i="{i:02d}"}} {go_float(value)}' for i, value in enumerate(values)]
