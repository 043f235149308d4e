"""The pure core of history: windows, value encoding, query parameters and re-downsampling. No I/O, no trio.

Windows are aligned on the Unix epoch: with an interval of ``W`` seconds (a whole number of minutes) window ``k``
holds the samples stamped in ``[k*W, (k+1)*W)`` and is written as one point stamped at its end, ``(k+1)*W``, holding
the window's average, minimum and maximum. A window with no sample writes nothing: a stall leaves a gap, never an
invented point.

On disk a value is an integer in a per-series quantum (``quantum_for``): hundredths for most metrics, MiB for byte
metrics. A point stores the average and the distances from it down to the minimum and up to the maximum, so a steady
series costs almost nothing for its min and max (sqlite stores the integer 0 in no bytes at all).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from nvdaemon import gotime
from nvdaemon.model import Labels, Sample

# The Go agent's five GPU metrics (its default), then ours.
DEFAULT_METRICS = (
    "gpu_utilization_pct",
    "gpu_mem_used_bytes",
    "gpu_mem_total_bytes",
    "gpu_temperature_celsius",
    "gpu_power_watts",
    "smart_reallocated_sectors",
    "smart_pending_sectors",
    "nvme_percentage_used",
    "temp_celsius",
)
EPOCH = 1_577_836_800  # 2020-01-01T00:00:00Z: stored times are minutes since then (3 bytes each until 2035)
MAX_POINTS = 200_000  # a query answering more is refused with 413 and a hint
INT_LIMIT = 2**61  # encoded values are clamped here so sums and differences stay within sqlite's 64 bits

SeriesKey = tuple[str, str, Labels]  # metric, device, labels sorted
Point = tuple[int, float, float, float]  # unix seconds (window end), avg, min, max


def allowlist(metrics: Sequence[str]) -> frozenset[str]:
    """``history.metrics``, or the default allowlist when it is empty."""
    return frozenset(metrics or DEFAULT_METRICS)


def tier_of(metric: str) -> str:
    """The tier that collects ``metric``: one node's series are one per (metric, device, labels), and the Go
    catalogue's names say their tier (nodevitals-contract.md section 2: every gpu-tier metric is ``gpu_*``, every
    smart-tier one ``smart_*`` or ``nvme_*``, no core one either), so the file does not store it."""
    if metric.startswith("gpu_"):
        return "gpu"
    if metric.startswith(("smart_", "nvme_")):
        return "smart"
    return "core"


# ---- windows --------------------------------------------------------------------------------------------------
class Acc:
    """Running count, sum, minimum and maximum of one series in one window."""

    __slots__ = ("hi", "lo", "n", "total")

    def __init__(self, n: int, total: float, lo: float, hi: float) -> None:
        self.n, self.total, self.lo, self.hi = n, total, lo, hi

    def add(self, v: float) -> None:
        self.n += 1
        self.total += v
        if v < self.lo:
            self.lo = v
        elif v > self.hi:
            self.hi = v

    def merge(self, other: Acc) -> None:
        self.n += other.n
        self.total += other.total
        self.lo = min(self.lo, other.lo)
        self.hi = max(self.hi, other.hi)

    @property
    def avg(self) -> float:
        # Clamped: rounding in a long sum must not put the average outside [min, max].
        return min(self.hi, max(self.lo, self.total / self.n))

    def as_tuple(self) -> tuple[int, float, float, float]:
        return (self.n, self.total, self.lo, self.hi)


WindowKey = tuple[SeriesKey, int]  # series, window end (unix seconds)


def window_end(ts: float, interval: int) -> int:
    """The end (unix seconds) of the window holding time ``ts``."""
    return (int(ts // interval) + 1) * interval


class Windows:
    """In-memory accumulation: one ``Acc`` per (series, window). ``ingest`` is what every tick pays."""

    def __init__(self, interval: int, metrics: Iterable[str]) -> None:
        if interval <= 0 or interval % 60:
            raise ValueError("the history interval is a whole number of minutes")
        self.interval = interval
        self.allow = frozenset(metrics)
        self.open: dict[WindowKey, Acc] = {}
        self.non_finite = 0  # samples skipped: NaN or infinite values have no average

    def ingest(self, samples: Iterable[Sample], default_ts: float) -> None:
        allow, interval, open_ = self.allow, self.interval, self.open
        for s in samples:
            if s.metric not in allow:
                continue
            v = s.value
            if not math.isfinite(v):
                self.non_finite += 1
                continue
            ts = s.timestamp or default_ts
            key = ((s.metric, s.device, s.labels), (int(ts // interval) + 1) * interval)  # window_end, inlined
            acc = open_.get(key)
            if acc is None:
                open_[key] = Acc(1, v, v, v)
            else:
                acc.add(v)

    def take_complete(self, now: float) -> list[tuple[WindowKey, Acc]]:
        """Remove and return every window that has ended by ``now`` (oldest first)."""
        done = sorted(((k, a) for k, a in self.open.items() if k[1] <= now), key=lambda item: item[0][1])
        for k, _ in done:
            del self.open[k]
        return done

    def take_all(self) -> list[tuple[WindowKey, Acc]]:
        return self.take_complete(math.inf)

    def restore(self, items: Iterable[tuple[WindowKey, Acc]]) -> None:
        """Put windows back (a failed write, or windows in progress saved by the previous run)."""
        for key, acc in items:
            mine = self.open.get(key)
            if mine is None:
                self.open[key] = Acc(*acc.as_tuple())
            else:
                mine.merge(acc)


# ---- value encoding -------------------------------------------------------------------------------------------
def quantum_for(metric: str) -> int:
    """Resolution a series is stored at: negative ``-d`` means 1/d units, positive ``m`` means m units."""
    return 1 << 20 if "_bytes" in metric else -100


def encode(v: float, q: int) -> int:
    x = v * -q if q < 0 else v / q
    if not math.isfinite(x):
        return INT_LIMIT if x > 0 else -INT_LIMIT
    return max(-INT_LIMIT, min(INT_LIMIT, round(x)))


def decode(a: int, q: int) -> float:
    return a / -q if q < 0 else float(a * q)


def encode_point(acc: Acc, q: int) -> tuple[int, int, int]:
    """(average, average - minimum, maximum - average), all in quanta and never negative distances."""
    a, lo, hi = encode(acc.avg, q), encode(acc.lo, q), encode(acc.hi, q)
    return a, a - lo, hi - a


def decode_point(t: int, a: int, dlo: int, dhi: int, q: int) -> Point:
    return (from_minutes(t), decode(a, q), decode(a - dlo, q), decode(a + dhi, q))


# ---- stored times: whole minutes since EPOCH ------------------------------------------------------------------
def to_minutes(unix: int) -> int:
    return (unix - EPOCH) // 60


def first_minute(unix: int) -> int:
    """The first stored minute stamped at or after ``unix`` (``to_minutes`` rounded up)."""
    return -(-(unix - EPOCH) // 60)


def from_minutes(t: int) -> int:
    return EPOCH + t * 60


# ---- re-downsampling ------------------------------------------------------------------------------------------
def downsample(points: Iterable[Point], step: int) -> Iterator[Point]:
    """Merge points (oldest first) into buckets of ``step`` seconds aligned on the epoch, each stamped at its end
    like the windows: the average of the averages, the minimum of the minima, the maximum of the maxima. A bucket
    without points gives nothing."""
    bucket, acc = 0, None
    for t, avg, lo, hi in points:
        end = -(-t // step) * step
        if acc is not None and end == bucket:
            acc.merge(Acc(1, avg, lo, hi))
            continue
        if acc is not None:
            yield (bucket, acc.avg, acc.lo, acc.hi)
        bucket, acc = end, Acc(1, avg, lo, hi)
    if acc is not None:
        yield (bucket, acc.avg, acc.lo, acc.hi)


def buckets_between(first: int, last: int, step: int | None) -> int:
    """How many points at most a series with points stamped ``first``..``last`` (unix seconds) gives at ``step``."""
    if step is None:
        return (last - first) // 60 + 1
    return -(-last // step) - -(-first // step) + 1


class TooManyPoints(Exception):
    def __init__(self, points: int, limit: int) -> None:
        super().__init__(f"{points} points, more than {limit}")
        self.points, self.limit = points, limit


# ---- query parameters -----------------------------------------------------------------------------------------
MAX_DAYS = 36_500  # the Go agent's bound on range: 100 years, as days or as a duration
_DAYS = re.compile(r"[+-]?[0-9]+")  # Go's strconv.Atoi: an optional sign and ASCII digits
PARAMS = ("range", "step", "device", "node")


class ParamError(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def parse_span(text: str, param: str) -> float | None:
    """``range`` and ``step`` as the Go agent reads ``range``: ``Nd`` (whole days, 1 to 36,500) or any Go duration
    (``90m``, ``1h30m``, ``2h45m30s``, ``1.5h``, ``300ms``), positive and at most 36,500 days. Seconds; empty means
    none."""
    if text == "":
        return None
    if text.endswith("d"):
        days = text[:-1]
        if _DAYS.fullmatch(days) is None or not 0 < int(days) <= MAX_DAYS:
            raise ParamError(param, f"expected whole days from 1d to {MAX_DAYS}d, or a Go duration such as 1h30m")
        return int(days) * 86400.0
    try:
        nanos = gotime.parse_duration(text)
    except gotime.DurationError as exc:
        raise ParamError(param, f"{exc}: expected Nd or a Go duration such as 90m, 1h30m or 1.5h") from None
    if nanos <= 0:
        raise ParamError(param, "must be longer than zero")
    if nanos > MAX_DAYS * 86400 * gotime.SECOND:
        raise ParamError(param, f"longer than {MAX_DAYS} days")
    return nanos / gotime.SECOND


@dataclass(frozen=True)
class Query:
    since: int | None  # unix seconds: points stamped at or after it; None = everything kept
    step: int | None  # seconds; None = as stored
    device: str | None
    node: str | None


def _text(param: str, value: str) -> str:
    if len(value) > 1024:
        raise ParamError(param, "longer than 1024 characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ParamError(param, "not valid UTF-8") from None
    if "\x00" in value:
        raise ParamError(param, "contains a NUL character")
    return value


def parse_query(args: Mapping[str, Sequence[str]], now: float) -> Query:
    """The query string of ``GET /v1/history/{metric}``; raises ``ParamError`` naming the parameter."""
    for key in args:
        if key not in PARAMS:
            shown = key if 0 < len(key) <= 64 and key.isprintable() and key.isascii() else "(unprintable)"
            raise ParamError(shown, "unknown parameter")
    one: dict[str, str] = {}
    for key in PARAMS:
        values = args.get(key, [])
        if len(values) > 1:
            raise ParamError(key, "given more than once")
        one[key] = _text(key, values[0]) if values else ""
    span = parse_span(one["range"], "range")
    step = parse_span(one["step"], "step")
    if step is not None and step < 60:
        raise ParamError("step", "at least 1m (points are whole minutes apart)")
    if step is not None and not step.is_integer():
        raise ParamError("step", "a whole number of seconds")
    return Query(
        # As the Go agent: points stamped at or after the second that holds now - range.
        since=None if span is None else math.floor(now - span),
        step=None if step is None else int(step),
        device=one["device"] or None,
        node=one["node"] or None,
    )


def check_metric(metric: str) -> str:
    return _text("metric", metric)
