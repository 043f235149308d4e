"""Metric families and their Prometheus text exposition (format 0.0.4), written without prometheus_client.

The output is byte for byte what prometheus_client 0.26's ``generate_latest`` writes for the same families, because
``/metrics`` must not change (tests/golden, the node_exporter oracle, promtool): labels sorted by name, values in its
Go-like float spelling (``format_value``), a counter family named without ``_total`` and its samples with it, HELP
escaped (``\\\\``, ``\\n``), label values escaped (``\\\\``, ``\\n``, ``\\"``), a label name outside the legacy
character set with each bad character replaced by ``_``. The family classes keep prometheus_client's names and
constructor shapes (``CounterMetricFamily(name, documentation, labels=[...])``, ``add_metric(values, value)``), so a
sink builds its families as it did; only what the agent uses is kept (no timestamps, created samples or exemplars).

Why not prometheus_client itself: render speed. Its ``generate_latest`` took 2.6x the time of ``render`` for the
same core-tier families of one host (40 families, 112 samples: 0.48 ms against 0.19 ms, median of 300, output
byte-identical). Memory is no reason: into an agent that has loaded its own modules, prometheus_client 0.26 adds
about 0.3 MiB of RSS (most of the 12 MiB it costs a bare interpreter is standard library the agent imports anyway):
``python -c 'import nvdaemon.app, resource as r; a = r.getrusage(r.RUSAGE_SELF).ru_maxrss; import prometheus_client;
print((r.getrusage(r.RUSAGE_SELF).ru_maxrss - a) / 1024, "MiB")'``.

A wire format, not a collector: it reads no file and imports nothing of the agent, so any layer may use it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple

_LEGACY_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_BAD_LABEL_CHAR = re.compile(r"^[^a-zA-Z_]|[^a-zA-Z0-9_]")  # a digit is bad only first


class Sample(NamedTuple):
    name: str
    labels: dict[str, str]
    value: float


class Metric:
    """A family: its name (a counter's without ``_total``), HELP text, type and samples."""

    __slots__ = ("_labelnames", "documentation", "name", "samples", "type")

    def __init__(self, name: str, documentation: str, typ: str, labels: Sequence[str] | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.samples: list[Sample] = []
        self._labelnames = tuple(labels or ())

    def _labels(self, values: Sequence[str]) -> dict[str, str]:
        return dict(zip(self._labelnames, values, strict=False))  # as prometheus_client: extras are cut


class GaugeMetricFamily(Metric):
    def __init__(
        self, name: str, documentation: str, value: float | None = None, labels: Sequence[str] | None = None
    ) -> None:
        super().__init__(name, documentation, "gauge", labels)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append(Sample(self.name, self._labels(labels), value))


class CounterMetricFamily(Metric):
    def __init__(
        self, name: str, documentation: str, value: float | None = None, labels: Sequence[str] | None = None
    ) -> None:
        super().__init__(name.removesuffix("_total"), documentation, "counter", labels)
        if value is not None:
            self.add_metric([], value)

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.samples.append(Sample(self.name + "_total", self._labels(labels), value))


class HistogramMetricFamily(Metric):
    def __init__(self, name: str, documentation: str, labels: Sequence[str] | None = None) -> None:
        super().__init__(name, documentation, "histogram", labels)

    def add_metric(self, labels: Sequence[str], buckets: Sequence[tuple[str, float]], sum_value: float | None) -> None:
        """``buckets``: (upper bound as written in ``le``, cumulative count), sorted, ``+Inf`` last (the count)."""
        for le, count in buckets:
            self.samples.append(Sample(self.name + "_bucket", {**self._labels(labels), "le": le}, count))
        if float(buckets[0][0]) >= 0 and sum_value is not None:  # no sum or count with negative buckets
            self.samples.append(Sample(self.name + "_count", self._labels(labels), buckets[-1][1]))
            self.samples.append(Sample(self.name + "_sum", self._labels(labels), sum_value))


def format_value(value: float) -> str:
    """A sample value as prometheus_client spells it: Python's shortest repr, ``+Inf``/``-Inf``/``NaN``, and a
    positive number with more than six digits before the point in exponent form (``918273645.0`` ->
    ``9.18273645e+08``), as Go would."""
    d = float(value)
    s = repr(d)
    dot = s.find(".")
    if dot > 6 and d > 0:  # repr has a point for every finite value below 1e16
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    if dot < 0 and "e" not in s:
        return {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}[s]
    return s


def escape_label_value(value: str) -> str:
    """A label value as the text format writes it between quotes: ``\\``, ``\\n`` and ``\\"`` for backslash,
    newline and double quote (prometheus_client and Go's encoder alike; the node_exporter surface uses it too)."""
    # Three substring tests cost less than a cache lookup, and a cache of a bounded size thrashed once the label
    # values of a large host (many disks times their attributes) outgrew it.
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def escape_help(text: str) -> str:
    """HELP text as the text format writes it: ``\\`` and ``\\n`` for backslash and newline."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


@lru_cache(maxsize=1024)
def label_name(name: str) -> str:
    """The name as written: unchanged when legacy-valid, else with each character outside that set (a digit only
    when first) replaced by ``_``. Cached: an agent has a few dozen label names."""
    if _LEGACY_LABEL.fullmatch(name):
        return name
    return _BAD_LABEL_CHAR.sub("_", name)


def sample_line(name: str, labels: dict[str, str], value: float) -> str:
    """``name{k="v",...} value\\n``, labels sorted by name."""
    return f"{series_text(name, labels)}{format_value(value)}\n"


def series_text(name: str, labels: dict[str, str]) -> str:
    """``name{k="v",...} ``: a sample line up to its value, labels sorted by name (what a renderer that keeps the
    lines of a series across renders keeps)."""
    if not labels:
        return name + " "
    pairs = ",".join(f'{label_name(k)}="{escape_label_value(labels[k])}"' for k in sorted(labels))
    return f"{name}{{{pairs}}} "


def same_text(value: float, before: float) -> bool:
    """Whether ``value`` is spelled as ``before`` was, for a renderer that reuses a series' line when its value
    did not change: equal, and not zeros of different signs (``0.0 == -0.0``, but they are written apart). NaN is
    never equal, so it is always spelled again (as ``NaN``)."""
    return value == before and (value != 0 or math.copysign(1.0, value) == math.copysign(1.0, before))


def header(name: str, documentation: str, typ: str) -> str:
    """The HELP and TYPE lines of a family (``name`` as exposed: a counter's with ``_total``)."""
    return f"# HELP {name} {escape_help(documentation)}\n# TYPE {name} {typ}\n"


def render(families: Iterable[Metric]) -> str:
    """The exposition of ``families`` in order: HELP, TYPE and sample lines for each (HELP and TYPE also for a
    family without samples)."""
    out: list[str] = []
    for fam in families:
        exposed = fam.name + "_total" if fam.type == "counter" else fam.name
        out.append(header(exposed, fam.documentation, fam.type))
        out.extend(sample_line(s.name, s.labels, s.value) for s in fam.samples)
    return "".join(out)
