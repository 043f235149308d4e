"""The Prometheus text-format parser on its own (nvdaemon/promtext.py): families out, expfmt's refusals, values as
expfmt reads them (Go's ParseFloat once p, P and _ are refused), and no agent module but Go's parsing rules pulled in
by importing it."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvdaemon.collectors.base import ParseError
from nvdaemon.goparse import parse_float
from nvdaemon.promtext import PromTextError, _float, parse_text

TEXT = b"""# HELP up Whether it is up.
# TYPE up gauge
up{job="a",esc="q\\"n\\nb\\\\"} 1
# TYPE rpc summary
rpc{quantile="0.5"} 2
rpc_sum 10
rpc_count 4
# TYPE lat histogram
lat_bucket{le="1"} 3
lat_bucket{le="+Inf"} 5
lat_sum 7.5
lat_count 5
bare -Inf
"""


def test_families_summaries_and_histograms() -> None:
    fams = parse_text(TEXT)
    assert list(fams) == ["up", "rpc", "lat", "bare"]
    up = fams["up"]
    assert (up.help, up.type, len(up.metrics)) == ("Whether it is up.", "gauge", 1)
    assert up.metrics[0].labels == [("job", "a"), ("esc", 'q"n\nb\\')] and up.metrics[0].value == 1.0
    (rpc,) = fams["rpc"].metrics
    assert (rpc.quantiles, rpc.sum, rpc.count) == ({0.5: 2.0}, 10.0, 4.0)
    (lat,) = fams["lat"].metrics
    assert (lat.buckets, lat.sum, lat.count) == ({1.0: 3.0, math.inf: 5.0}, 7.5, 5.0)
    assert fams["bare"].type == "untyped" and fams["bare"].metrics[0].value == -math.inf


@pytest.mark.parametrize(
    "bad",
    [
        b"x 1 1700000000000\n",  # client-side timestamp
        b"x 0x1p2\n",
        b"x 1_000\n",
        b"x 1e999\n",  # overflows: Go's ErrRange
        b"# TYPE x gauge\n# TYPE x gauge\n",
        b"x{a=1} 1\n",
        b"9x 1\n",
        b"x -nan\n",
    ],
)
def test_what_expfmt_refuses_is_a_promtext_error(bad: bytes) -> None:
    with pytest.raises(PromTextError):
        parse_text(bad)


@given(st.text(alphabet="0123456789+-._eEpPxXaAfFiInNtTyY", max_size=12))
def test_values_read_as_go_parse_float_after_expfmts_refusals(token: str) -> None:
    """The parser keeps its own copy of the part of ParseFloat expfmt lets through, so it imports nothing of ours."""
    try:
        expected: float | None = None if any(c in token for c in "pP_") else parse_float(token)
    except ParseError:
        expected = None
    try:
        got: float | None = _float(token)
    except ValueError:
        got = None
    assert (got is None) == (expected is None), token
    if got is not None and expected is not None:
        assert got == expected or (math.isnan(got) and math.isnan(expected))


def test_importing_the_parser_loads_no_agent_module() -> None:
    code = "import sys, nvdaemon.promtext; print(' '.join(sorted(m for m in sys.modules if m.startswith('nvdaemon'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["nvdaemon", "nvdaemon.goparse", "nvdaemon.promtext"]  # Go's parsing rules, nothing else
