"""nvdaemon/exposition.py writes what prometheus_client 0.26's ``generate_latest`` wrote for the same families, byte
for byte (the /metrics text must not change): generated families, and the ``nodevitals_hw_*`` families as the agent
built them through prometheus_client before (``hardware_before``) against ``MetricsCache``'s parts."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import core as pc
from prometheus_client.registry import Collector

from nvdaemon import exposition as ex
from nvdaemon.catalogue import help_for
from nvdaemon.model import Kind, Sample, TierSnapshot
from nvdaemon.server.metrics import PREFIX, MetricsCache, exposed_as_counter
from tests.server.fakeview import make_view


class Families(Collector):
    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> Iterator[Any]:
        yield from self.families


def theirs(families: list[Any]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(families))
    return generate_latest(registry).decode()


VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0.0, -0.0, 1e16, 1234567.0, 12345678.5, 1e-7, 9.18273645e08, 1.5e300, 24.51]),
)
TEXT = st.text(st.sampled_from('ab_Z9 \\\n"é.:-'), max_size=8)
LABEL_NAMES = st.lists(st.sampled_from(["device", "a", "zeta", "b_2", "le_x", "9bad", "do.t", "_u"]), max_size=4)
NAMES = st.sampled_from(["x", "a_b", "x_total", "some:name"])


@st.composite
def family_specs(draw: st.DrawFn) -> tuple[str, str, str, list[str], list[tuple[list[str], Any]]]:
    kind = draw(st.sampled_from(["gauge", "counter", "histogram"]))
    labels = draw(LABEL_NAMES)
    rows: list[tuple[list[str], Any]] = []
    for _ in range(draw(st.integers(0, 4))):
        values = draw(st.lists(TEXT, min_size=0, max_size=len(labels) + 1))  # too few or too many: cut by zip
        if kind == "histogram":
            bounds = sorted(draw(st.lists(st.floats(-5, 100, allow_nan=False), min_size=1, max_size=3)))
            counts = [(str(b), float(i)) for i, b in enumerate(bounds)]
            rows.append((values, ([*counts, ("+Inf", float(len(bounds)))], draw(st.none() | VALUES))))
        else:
            rows.append((values, draw(VALUES)))
    return kind, draw(NAMES), draw(TEXT), labels, rows


@settings(max_examples=300, deadline=None)
@given(st.lists(family_specs(), max_size=4))
def test_generated_families_render_as_prometheus_client_renders_them(specs: list[Any]) -> None:
    ours: list[ex.Metric] = []
    reference: list[Any] = []
    for kind, name, doc, labels, rows in specs:
        if kind == "histogram":
            base = name.removesuffix("_total")
            h = ex.HistogramMetricFamily(base, doc, labels=labels)
            hb = pc.HistogramMetricFamily(base, doc, labels=labels)
            for values, (buckets, total) in rows:
                h.add_metric(values, buckets, total)
                hb.add_metric(values, buckets, total)
            ours.append(h)
            reference.append(hb)
            continue
        a: ex.GaugeMetricFamily | ex.CounterMetricFamily
        b: pc.GaugeMetricFamily | pc.CounterMetricFamily
        if kind == "gauge":
            a, b = ex.GaugeMetricFamily(name, doc, labels=labels), pc.GaugeMetricFamily(name, doc, labels=labels)
        else:
            a, b = ex.CounterMetricFamily(name, doc, labels=labels), pc.CounterMetricFamily(name, doc, labels=labels)
        for values, value in rows:
            a.add_metric(values, value)
            b.add_metric(values, value)
        ours.append(a)
        reference.append(b)
    assert ex.render(ours) == theirs(reference)


@given(VALUES)
def test_values_are_spelt_as_prometheus_client_spells_them(value: float) -> None:
    from prometheus_client.utils import floatToGoString

    assert ex.format_value(value) == floatToGoString(value)  # type: ignore[no-untyped-call]


def test_unlabelled_families_with_a_value() -> None:
    ours = [ex.GaugeMetricFamily("g", "G.", 3), ex.CounterMetricFamily("c_total", "C.", math.inf)]
    reference = [pc.GaugeMetricFamily("g", "G.", 3), pc.CounterMetricFamily("c_total", "C.", math.inf)]
    assert (
        ex.render(ours)
        == theirs(reference)
        == "# HELP g G.\n# TYPE g gauge\ng 3.0\n" + ("# HELP c_total C.\n# TYPE c_total counter\nc_total +Inf\n")
    )


def hardware_before(node: str, snapshots: dict[str, TierSnapshot]) -> str:
    """The ``nodevitals_hw_*`` families as ``/metrics`` built them through prometheus_client before."""
    families: dict[str, Any] = {}
    for tier, snap in sorted(snapshots.items()):
        for s in snap.samples:
            fam = families.get(s.metric)
            if fam is None:
                cls = pc.CounterMetricFamily if exposed_as_counter(s.metric, s.kind) else pc.GaugeMetricFamily
                labels = ["node", "tier", "device", *(k for k, _ in s.labels)]
                fam = families[s.metric] = cls(PREFIX + s.metric, help_for(s.metric), labels=labels)
            fam.add_metric([node, tier, s.device, *(v for _, v in s.labels)], s.value)
    return theirs([families[m] for m in sorted(families)])


SAMPLES = st.builds(
    Sample,
    metric=st.sampled_from(["load1", "disk_read_bytes_total", "x_total", "gpu_temperature_celsius"]),
    device=TEXT,
    value=VALUES.map(float),
    kind=st.sampled_from(list(Kind)),
    labels=st.lists(st.tuples(st.sampled_from(["share", "gpu_uuid", "a"]), TEXT), max_size=2).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["core", "gpu", "smart"]), st.lists(SAMPLES, max_size=6), max_size=3))
def test_hardware_families_match_what_prometheus_client_wrote(tmp_path_factory: Any, tiers: dict[str, Any]) -> None:
    """Tiers sharing a metric, samples of one metric with other label names (the first one's names are kept, the
    values zipped onto them), counters with and without ``_total``, label values needing escapes."""
    view = make_view(tmp_path_factory.mktemp("x"))
    for tier, samples in tiers.items():
        view.take(TierSnapshot(tier, samples, {}, collected_at=1.0, duration=0.01))
    text = MetricsCache(view).render().decode()
    hw = "".join(
        line + "\n"
        for line in text.splitlines()
        if line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith(PREFIX)
    )
    assert hw == hardware_before(view.node, view.snapshots)


def test_the_agent_never_imports_prometheus_client() -> None:
    """The agent writes its exposition itself (about 12 MiB of RSS saved on a bare interpreter, less once trio and
    hypercorn have loaded what it shares with them); a fresh interpreter loading every module of the package
    must not pull it in."""
    import subprocess
    import sys

    code = (
        "import pkgutil, sys, nvdaemon\n"
        "for m in pkgutil.walk_packages(nvdaemon.__path__, 'nvdaemon.'):\n"
        "    if not m.name.startswith('nvdaemon.proto.') and m.name != 'nvdaemon.__main__':\n"
        "        __import__(m.name)\n"
        "print(sorted(n for n in sys.modules if n.startswith('prometheus_client')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
