"""The pure core: windows (boundaries, stalls), value encoding, re-downsampling and query parameters, with tables
and hypothesis."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nvdaemon.history.core import (
    DEFAULT_METRICS,
    Acc,
    ParamError,
    Query,
    Windows,
    allowlist,
    buckets_between,
    decode_point,
    downsample,
    encode_point,
    parse_query,
    parse_span,
    quantum_for,
    tier_of,
    to_minutes,
)
from nvdaemon.model import Sample

T0 = 1_700_000_100  # a multiple of 300
GPU = ("gpu_temperature_celsius", "gpu0", ())


def temp(value: float, ts: float, device: str = "gpu0") -> Sample:
    return Sample("gpu_temperature_celsius", device, value, timestamp=ts)


def points(w: Windows, now: float) -> list[tuple[str, int, float, float, float, int]]:
    return [(k[0][1], k[1], a.avg, a.lo, a.hi, a.n) for k, a in w.take_complete(now)]


def test_default_allowlist_applies_only_when_metrics_is_empty() -> None:
    assert allowlist([]) == frozenset(DEFAULT_METRICS)
    assert "gpu_power_watts" in allowlist([]) and "temp_celsius" in allowlist([])
    # The Go agent's default, all five: a client of its /v1/history finds them without configuring anything.
    go = {
        "gpu_utilization_pct",
        "gpu_mem_used_bytes",
        "gpu_mem_total_bytes",
        "gpu_temperature_celsius",
        "gpu_power_watts",
    }
    assert go <= allowlist([])
    assert allowlist(["load1"]) == {"load1"}


def test_window_boundaries_avg_min_max_stamped_at_end() -> None:
    w = Windows(300, allowlist([]))
    w.ingest([temp(40, T0), temp(50, T0 + 150), temp(90, T0 + 299.999)], T0)
    w.ingest([temp(10, T0 + 300)], T0 + 300)  # exactly at the boundary: the next window
    w.ingest([Sample("load1", "cpu", 5.0, timestamp=T0)], T0)  # not allowlisted
    assert points(w, T0 + 299) == []  # not ended yet
    assert points(w, T0 + 300) == [("gpu0", T0 + 300, 60.0, 40.0, 90.0, 3)]
    assert points(w, T0 + 600) == [("gpu0", T0 + 600, 10.0, 10.0, 10.0, 1)]
    assert w.open == {}


def test_a_stall_writes_what_it_has_and_invents_nothing() -> None:
    w = Windows(300, allowlist([]))
    w.ingest([temp(40, T0 + 10)], T0 + 10)
    w.ingest([temp(70, T0 + 3 * 300 + 5), temp(80, T0 + 3 * 300 + 6)], T0 + 905)
    w.ingest([temp(20, T0 + 4 * 300 + 1)], T0 + 1201)  # the window in progress at flush time
    # One flush after four windows: two points, each at its own window's end; windows 2 and 3 had nothing.
    assert points(w, T0 + 4 * 300 + 30) == [
        ("gpu0", T0 + 300, 40.0, 40.0, 40.0, 1),
        ("gpu0", T0 + 4 * 300, 75.0, 70.0, 80.0, 2),
    ]
    assert [k[1] for k in w.open] == [T0 + 5 * 300]


def test_series_are_kept_apart_by_device_and_labels_and_non_finite_values_skipped() -> None:
    w = Windows(60, ["psi_stall_ratio_avg10"])
    a = Sample("psi_stall_ratio_avg10", "memory", 50.0, labels=(("share", "some"),), timestamp=T0)
    b = Sample("psi_stall_ratio_avg10", "memory", 70.0, labels=(("share", "full"),), timestamp=T0)
    nan = Sample("psi_stall_ratio_avg10", "memory", math.nan, labels=(("share", "some"),), timestamp=T0)
    w.ingest([a, b, nan, Sample("psi_stall_ratio_avg10", "memory", math.inf, timestamp=T0)], T0)
    assert sorted((k[0][2], acc.avg) for k, acc in w.take_complete(T0 + 60)) == [
        ((("share", "full"),), 70.0),
        ((("share", "some"),), 50.0),
    ]
    assert w.non_finite == 2


def test_a_sample_without_timestamp_takes_the_snapshot_time_and_restore_merges() -> None:
    w = Windows(300, allowlist([]))
    w.ingest([Sample("gpu_temperature_celsius", "gpu0", 30.0)], T0 + 1)
    w.restore([((GPU, T0 + 300), Acc(2, 100.0, 45.0, 55.0))])
    assert points(w, T0 + 300) == [("gpu0", T0 + 300, 130 / 3, 30.0, 55.0, 3)]


def test_interval_must_be_whole_minutes() -> None:
    with pytest.raises(ValueError, match="whole number of minutes"):
        Windows(90, ["x"])


@given(
    st.lists(st.floats(-1e12, 1e12, allow_nan=False), min_size=1, max_size=20),
    st.sampled_from(["gpu_temperature_celsius", "gpu_mem_used_bytes"]),
)
def test_encoding_keeps_order_and_resolution(values: list[float], metric: str) -> None:
    acc = Acc(1, values[0], values[0], values[0])
    for v in values[1:]:
        acc.add(v)
    q = quantum_for(metric)
    a, dlo, dhi = encode_point(acc, q)
    assert dlo >= 0 and dhi >= 0
    t, avg, lo, hi = decode_point(to_minutes(T0), a, dlo, dhi, q)
    assert t == T0 and lo <= avg <= hi
    resolution = 1 / -q if q < 0 else q
    for got, want in ((avg, acc.avg), (lo, min(values)), (hi, max(values))):
        assert abs(got - want) <= resolution / 2 + abs(want) * 1e-12


def test_quantum_hundredths_and_mebibytes() -> None:
    assert decode_point(0, *encode_point(Acc(1, 45.234, 45.234, 45.234), -100), -100)[1] == 45.23
    assert quantum_for("gpu_mem_used_bytes") == 1 << 20


@pytest.mark.parametrize(
    ("step", "want"),
    [
        (600, [(600, 15.0, 0.0, 30.0), (1200, 35.0, 25.0, 50.0)]),
        (3600, [(3600, 25.0, 0.0, 50.0)]),
    ],
)
def test_downsample_table(step: int, want: list[tuple[int, float, float, float]]) -> None:
    pts = [(300, 10.0, 0.0, 20.0), (600, 20.0, 15.0, 30.0), (900, 30.0, 25.0, 40.0), (1200, 40.0, 35.0, 50.0)]
    assert list(downsample(pts, step)) == want


@given(st.lists(st.tuples(st.integers(1, 5000), st.floats(-1e6, 1e6)), max_size=60), st.integers(1, 50))
def test_downsample_properties(raw: list[tuple[int, float]], k: int) -> None:
    pts = [(m * 60, v, v - 1, v + 1) for m, v in sorted(dict(raw).items())]
    step = k * 60
    out = list(downsample(pts, step))
    assert [p[0] for p in out] == sorted({-(-p[0] // step) * step for p in pts})
    assert all(lo <= avg <= hi for _, avg, lo, hi in out)
    for end, avg, lo, hi in out:  # each bucket: mean of the averages, min of the minima, max of the maxima
        inside = [p for p in pts if end - step < p[0] <= end]
        assert avg == pytest.approx(sum(p[1] for p in inside) / len(inside), rel=1e-9, abs=1e-6)
        assert (lo, hi) == (min(p[2] for p in inside), max(p[3] for p in inside))
    if pts:
        assert min(p[2] for p in out) == min(p[2] for p in pts)
        assert max(p[3] for p in out) == max(p[3] for p in pts)
        assert len(out) <= buckets_between(pts[0][0], pts[-1][0], step)
        assert len(pts) <= buckets_between(pts[0][0], pts[-1][0], None)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("", None),
        ("90d", 90 * 86400),
        ("+7d", 7 * 86400),  # Go's strconv.Atoi takes a sign and leading zeros
        ("007d", 7 * 86400),
        ("36500d", 36500 * 86400),
        ("6h", 21600),
        ("30m", 1800),
        ("45s", 45),
        ("90m", 5400),
        ("1h30m", 5400),
        ("2h45m30s", 9930),
        ("1.5h", 5400),
        ("300ms", 0.3),
        ("1h0.5m", 3630),
        ("876000h", 36500 * 86400),
    ],
)
def test_parse_span_takes_days_and_go_durations(text: str, seconds: float | None) -> None:
    assert parse_span(text, "range") == seconds


@pytest.mark.parametrize(
    "text",
    [
        "0d",
        "-5d",
        "d",
        "1.5d",
        "36501d",
        "99999999999d",
        "\u0663d",
        " 5d",
        "5d ",  # days
        "5",
        "5x",
        "2w",
        "1y",
        "0",
        "-1h",
        "+0s",
        "0s",
        "-0",
        "876000h1ns",
        "9223372036854775808ns",  # durations
        "1h 30m",
        "1h_30m",
        ".h",
        "h",
    ],
)
def test_parse_span_rejects(text: str) -> None:
    with pytest.raises(ParamError) as info:
        parse_span(text, "step")
    assert info.value.param == "step"


@pytest.mark.parametrize(
    ("metric", "tier"),
    [
        ("gpu_temperature_celsius", "gpu"),
        ("gpu_ecc_uncorrected_total", "gpu"),
        ("smart_pending_sectors", "smart"),
        ("nvme_percentage_used", "smart"),
        ("load1", "core"),
        ("temp_celsius", "core"),
        ("psi_stall_seconds_total", "core"),
    ],
)
def test_tier_of_follows_the_go_catalogue(metric: str, tier: str) -> None:
    assert tier_of(metric) == tier


@pytest.mark.parametrize(
    ("args", "param"),
    [
        ({"range": ["x"]}, "range"),
        ({"step": ["30s"]}, "step"),
        ({"step": ["61500ms"]}, "step"),  # buckets are whole seconds
        ({"range": ["1h30"]}, "range"),
        ({"step": ["1h"], "range": ["1d", "2d"]}, "range"),
        ({"device": ["a\x00b"]}, "device"),
        ({"node": ["n" * 2000]}, "node"),
        ({"rnage": ["1d"]}, "rnage"),
    ],
)
def test_parse_query_names_the_bad_parameter(args: dict[str, list[str]], param: str) -> None:
    with pytest.raises(ParamError) as info:
        parse_query(args, now=T0)
    assert info.value.param == param


def test_parse_query_values() -> None:
    q = parse_query({"range": ["1d"], "step": ["1h"], "device": ["gpu1"], "node": ["n1"]}, now=T0 + 0.5)
    assert (q.since, q.step, q.device, q.node) == (T0 - 86400, 3600, "gpu1", "n1")  # Go's: floor(now - range)
    assert parse_query({"range": ["1h30m"], "step": ["1.5m"]}, now=T0 + 0.5) == Query(T0 - 5400, 90, None, None)
    empty = parse_query({"range": [""], "device": [""]}, now=T0)
    assert (empty.since, empty.step, empty.device, empty.node) == (None, None, None, None)


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=8), st.lists(st.text(max_size=30), max_size=3), max_size=4))
def test_parse_query_garbage_is_a_param_error_or_a_query(args: dict[str, list[str]]) -> None:
    try:
        q = parse_query(args, now=T0)
    except ParamError as exc:
        assert exc.param
    else:
        assert q.step is None or q.step >= 60
