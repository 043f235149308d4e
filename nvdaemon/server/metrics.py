"""``/metrics``: the exposition of the latest snapshots, rendered when scraped (or just before), only the parts that
changed.

Hardware samples are exposed as ``nodevitals_hw_<metric>{node,tier,device,<labels sorted>}``. A tick bumps
``AgentView.snapshot_version`` (events bump ``bus.published``, anything else ``changes``), and the next scrape finds
that key changed and renders again, from cached parts; while scrapes come about once a tick, the server renders right
after the tick instead (``prepare``, from ``nvdaemon.server.render_ahead``), and the scrape finds it made. A part is the
text of one input: each tier's ``nodevitals_hw_*`` samples and collector statuses (keyed by that tier's snapshot), the
smart tier's self metrics, the dcgm, smartctl and node_exporter surfaces (keyed by their snapshot and the few values
they also read), and the small parts whose inputs carry no version of their own (the tier loops' ticks, the agent's self
metrics, the sinks' metrics, the process's), rendered again on every scrape that finds the key changed.
``MetricsCache.renders`` counts renders per part. Between changes every scrape gets the same cached bytes. A scrape that
accepts gzip (``Accept-Encoding``, q-values honoured) gets the gzip of those bytes, compressed once per changed page
(``nvdaemon.server.gzip_body``; ``MetricsCache.compressions`` counts them), with ``Content-Encoding: gzip``; every
answer carries ``Vary: Accept-Encoding``.
The text is written by ``nvdaemon.exposition``, byte for byte what prometheus_client wrote before.

Two self metrics carry the Go agent's label sets exactly (nodevitals-contract.md §2):
``nodevitals_events_total{node,tier,device,condition,severity,phase,xid}`` counts emitted events (``xid`` empty but
for XIDs); ``nodevitals_delivery_dropped_total{sink}`` counts the events each sink lost, summed over reasons: for a
webhook, ``sink`` is ``webhook:<scheme>://<host[:port]>`` as Go writes it (path, query and credentials cut) and the
count is its spool drops and dead letters plus what it lost on the bus; for the stream hub, NVSentinel and history,
``sink`` is the sink's name and the count what it lost on the bus. The counts start again when a sink is rebuilt
(a reload that changed it), which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from nvdaemon.catalogue import help_for
from nvdaemon.compat.dcgm import pod_attributes, render_dcgm
from nvdaemon.compat.node_exporter.family import SeriesRenderer
from nvdaemon.compat.node_exporter.surface import surface_families
from nvdaemon.compat.smartctl import render_smartctl
from nvdaemon.exposition import format_value, header, render, same_text, series_text
from nvdaemon.kmsg.metrics import kmsg_metrics
from nvdaemon.model import Kind
from nvdaemon.server.gzip_body import GzipBody, accept_encodings, accepts_gzip
from nvdaemon.server.self_metrics import BUILD_INFO, process_metrics, self_metrics, sink_metrics
from nvdaemon.server.smart_metrics import smart_self_metrics
from nvdaemon.server.tier_metrics import tier_self_metrics

if TYPE_CHECKING:
    from nvdaemon.model import Sample, TierSnapshot
    from nvdaemon.view import AgentView

PREFIX = "nodevitals_hw_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
Headers = list[tuple[bytes, bytes]]
# The collector status families, in exposition order: (name as exposed, HELP, type, value of a status).
STATUS_FAMILIES: tuple[tuple[str, str, str, Callable[[Any], float]], ...] = (
    (
        "nodevitals_collector_success",
        "1 if the collector's last run had no error (an absent source is not one).",
        "gauge",
        lambda st: 1.0 if st.success else 0.0,
    ),
    (
        "nodevitals_collector_present",
        "1 if the collector's source exists on this node.",
        "gauge",
        lambda st: 1.0 if st.present else 0.0,
    ),
    (
        "nodevitals_collector_duration_seconds",
        "Wall time of the collector's last run.",
        "gauge",
        lambda st: st.duration,
    ),
    (
        "nodevitals_collector_errors_total",
        "Errors met by the collector since start (partial failures included).",
        "counter",
        lambda st: st.error_total,
    ),
)


def exposed_as_counter(metric: str, kind: Kind) -> bool:
    """TYPE counter only for a counter sample whose name already ends in ``_total``.

    A counter family's samples are named ``<family>_total`` in the text format, which would rename a series that
    lacks the suffix (the Go agent never does: its smart tier's ``smart_power_on_hours`` is a gauge); any other
    sample is exposed as a gauge.
    """
    return kind is Kind.COUNTER and metric.endswith("_total")


class HwFamily:
    """One tier's samples of one metric: whether the first one is exposed as a counter, the label names of the
    first one (node, tier, device, then its own), and the sample lines (every sample's values under those names,
    extra ones cut, as prometheus_client's families did)."""

    __slots__ = ("counter", "labelnames", "lines")

    def __init__(self, counter: bool, labelnames: tuple[str, ...]) -> None:
        self.counter = counter
        self.labelnames = labelnames
        self.lines: list[str] = []


class SeriesLines:
    """The sample lines one part wrote in its previous render, by series, so that the next render of a series whose
    value did not change costs a lookup, and of one whose value did, the value's spelling only.

    Measured on the gpunode fixture's core tier (266 ``nodevitals_hw_*`` samples, 41 collector statuses; median of
    10 successive snapshots x 20): hw_families from 0.70 ms to 0.15 ms (0.35 ms with every value changed),
    status_lines from 0.19 ms to 0.09 ms.
    Bounded: a render keeps only the series it wrote (``done``), so a series that went (a container's veth) is
    forgotten one render later.
    """

    __slots__ = ("_before", "_now")

    def __init__(self) -> None:
        self._before: dict[Hashable, tuple[float, str, int]] = {}  # key -> (value, line, length before the value)
        self._now: dict[Hashable, tuple[float, str, int]] = {}

    def line(self, key: Hashable, value: float, name: str, labels: Callable[[], dict[str, str]]) -> str:
        """``sample_line(name, labels(), value)``, ``key`` standing for ``name`` and the labels."""
        entry = self._before.get(key)
        if entry is None:
            text = series_text(name, labels())
            entry = (value, text + format_value(value) + "\n", len(text))
        elif not same_text(value, entry[0]):
            entry = (value, entry[1][: entry[2]] + format_value(value) + "\n", entry[2])
        self._now[key] = entry
        return entry[1]

    def __len__(self) -> int:
        """How many series it keeps: those of the previous render."""
        return len(self._before)

    def done(self) -> None:
        """The render is complete: what it wrote is what the next one may reuse."""
        self._before, self._now = self._now, {}


def hw_families(
    node: str,
    tier: str,
    samples: Sequence[Sample],
    labelnames: tuple[str, ...] = (),
    only: str = "",
    memo: SeriesLines | None = None,
) -> dict[str, HwFamily]:
    """The ``nodevitals_hw_*`` families of one tier's samples, in first-seen order (``only``: that metric's, under
    ``labelnames``); ``memo``: the lines of this tier's previous render."""
    families: dict[str, HwFamily] = {}
    lines = memo if memo is not None else SeriesLines()
    for s in samples:
        if only and s.metric != only:
            continue
        fam = families.get(s.metric)
        if fam is None:
            names = labelnames or ("node", "tier", "device", *(k for k, _ in s.labels))
            fam = families[s.metric] = HwFamily(exposed_as_counter(s.metric, s.kind), names)

        def labels(fam: HwFamily = fam, s: Sample = s) -> dict[str, str]:  # only for a series not seen last time
            return dict(zip(fam.labelnames, (node, tier, s.device, *(v for _, v in s.labels)), strict=False))

        key = (s.metric, s.device, s.labels, fam.labelnames, node, tier)  # what the line is made of, but the value
        fam.lines.append(lines.line(key, s.value, PREFIX + s.metric, labels))
    lines.done()
    return families


def status_lines(snap: TierSnapshot, memo: SeriesLines | None = None) -> tuple[str, ...]:
    """One tier's lines of each collector status family (STATUS_FAMILIES' order), collectors sorted by name;
    ``memo``: the lines of this tier's previous render."""
    statuses = sorted(snap.collectors.items())
    lines = memo if memo is not None else SeriesLines()
    out = tuple(
        "".join(lines.line((name, c), value(st), name, partial(dict, collector=c)) for c, st in statuses)
        for name, _, _, value in STATUS_FAMILIES
    )
    lines.done()
    return out


class ScrapeGaps:
    """When ``/metrics`` was last answered (``clock`` seconds), the gap between the last two answers (None until
    there are two) and whether the last was gzipped: what ``nvdaemon.server.render_ahead`` decides by."""

    __slots__ = ("clock", "last_at", "last_gap", "last_gzip")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_at: float | None = None
        self.last_gap: float | None = None
        self.last_gzip = False

    def note(self, gzip: bool) -> None:
        """A scrape answered now."""
        at = self.clock()
        if self.last_at is not None:
            self.last_gap = at - self.last_at
        self.last_at = at
        self.last_gzip = gzip

    def since_last(self) -> float:
        """Seconds since the last scrape (infinite before the first)."""
        return float("inf") if self.last_at is None else self.clock() - self.last_at


class MetricsCache:
    """The exposition, rendered on a scrape that finds the view changed (or ahead of it: ``prepare``), from parts
    cached by their inputs."""

    def __init__(self, view: AgentView, clock: Callable[[], float] = time.monotonic) -> None:
        self.view = view
        self._key: tuple[int, int, int, int] | None = None
        self._body = b""
        # part -> (the objects it was rendered from, compared by identity; the values, compared by equality; text)
        self._parts: dict[str, tuple[tuple[object, ...], tuple[object, ...], Any]] = {}
        self.renders: Counter[str] = Counter()  # part -> times rendered
        self._gzip = GzipBody()
        # The lines of the previous render of the parts redone every tick, by series (bounded by each part's
        # series: see SeriesLines and SeriesRenderer): part name -> lines, and the node_* surface's.
        self._series: dict[str, SeriesLines] = {}
        self._node_series = SeriesRenderer()
        self.scrape_gaps = ScrapeGaps(clock)

    def _part(self, name: str, refs: tuple[object, ...], values: tuple[object, ...], make: Callable[[], Any]) -> Any:
        cached = self._parts.get(name)
        if (
            cached is not None
            and len(cached[0]) == len(refs)
            and all(a is b for a, b in zip(cached[0], refs, strict=True))
            and cached[1] == values
        ):
            return cached[2]
        text = make()
        self._parts[name] = (refs, values, text)
        self.renders[name] += 1
        return text

    @property
    def compressions(self) -> int:
        """How many times a page was gzipped (at most once per changed page)."""
        return self._gzip.compressions

    def answer(self, accept_encoding: Sequence[str]) -> tuple[Headers, bytes]:
        """The response headers (content type, ``Vary``, ``Content-Encoding`` when gzipped; not the length) and body
        of a scrape with these ``Accept-Encoding`` header lines (none: identity)."""
        headers = [(b"content-type", CONTENT_TYPE.encode()), (b"vary", b"Accept-Encoding")]
        gzip = accepts_gzip(accept_encodings(accept_encoding))
        self.scrape_gaps.note(gzip)
        if gzip:
            return [*headers, (b"content-encoding", b"gzip")], self._gzip.of(self.render())
        return headers, self.render()

    def prepare(self, *, gzip: bool) -> None:
        """Render the page now if the view changed (and gzip it, with ``gzip``), so that the next scrape finds it
        made (``nvdaemon.server.render_ahead``)."""
        body = self.render()
        if gzip:
            self._gzip.of(body)

    def page(self, request_headers: Headers) -> tuple[Headers, bytes]:
        """``answer`` for raw ASGI request headers (the GET answered in front of quart)."""
        return self.answer([v.decode("latin-1") for k, v in request_headers if k.lower() == b"accept-encoding"])

    def render(self) -> bytes:
        view = self.view
        key = (view.snapshot_version, view.bus.published, view.reloads, view.changes)
        if key != self._key:
            self._body = self._render()
            self._key = key
        return self._body

    def _render(self) -> bytes:
        view = self.view
        snaps = view.snapshots
        on, rt = view.surfaces, view.gpu
        pa = rt.pod_attribution if rt is not None else None
        attribution = pa.current if pa is not None else None
        last_xid = tuple(rt.last_xid.items()) if rt is not None else ()
        smart, core, gpu = snaps.get("smart"), snaps.get("core"), snaps.get("gpu")
        parts = [
            self._hardware(snaps),
            self._statuses(snaps),
            self._part("smart", (smart,), (), lambda: render(smart_self_metrics(snaps)).encode()),
            self._always("tiers", lambda: render(tier_self_metrics(snaps, view.interval))),
            self._always("self", lambda: render(self_metrics(view))),
            self._always("sinks", lambda: render(sink_metrics(view))),
            self._always("kmsg", lambda: render(kmsg_metrics(view.kmsg))),
            BUILD_INFO,
            self._always("process", lambda: render(process_metrics())),
            self._part(
                "dcgm",
                (gpu, attribution),
                (on.dcgm, view.node, last_xid),
                lambda: render_dcgm(
                    gpu, enabled=on.dcgm, node=view.node, last_xid=dict(last_xid), pods=pod_attributes(attribution)
                ),
            ),
            self._part("smartctl", (smart,), (on.smartctl,), lambda: render_smartctl(smart, enabled=on.smartctl)),
            self._part(
                "node_exporter",
                (core,),
                (on.node_exporter,),
                lambda: self._node_exporter(core, enabled=on.node_exporter),
            ),
        ]
        return b"".join(parts)

    def _node_exporter(self, core: TierSnapshot | None, *, enabled: bool) -> bytes:
        """``render_node_exporter``, with the series texts of the previous render kept (``SeriesRenderer``)."""
        if not enabled or core is None:
            self._node_series = SeriesRenderer()  # what an earlier render kept is not needed any more
            return b""
        return self._node_series.render(surface_families(core))

    def _always(self, name: str, make: Callable[[], str]) -> bytes:
        """A part without a version of its inputs: rendered on every scrape that finds the view changed."""
        self.renders[name] += 1
        return make().encode()

    def _hardware(self, snaps: Mapping[str, TierSnapshot]) -> bytes:
        """The ``nodevitals_hw_*`` families: metrics sorted by name, each one's samples tier by tier (sorted)."""
        per_tier = [(tier, snap, self._hw_tier(tier, snap)) for tier, snap in sorted(snaps.items())]
        out: list[str] = []
        for metric in sorted({m for _, _, fams in per_tier for m in fams}):
            first: HwFamily | None = None
            for tier, snap, fams in per_tier:
                fam = fams.get(metric)
                if fam is None:
                    continue
                if first is None:
                    first = fam
                    out.append(header(PREFIX + metric, help_for(metric), "counter" if fam.counter else "gauge"))
                    out.extend(fam.lines)
                elif fam.labelnames == first.labelnames:
                    out.extend(fam.lines)
                else:  # rare: two tiers giving one metric other labels; one family, the first tier's label names
                    out.extend(hw_families(self.view.node, tier, snap.samples, first.labelnames, metric)[metric].lines)
        return "".join(out).encode()

    def _hw_tier(self, tier: str, snap: TierSnapshot) -> dict[str, HwFamily]:
        node = self.view.node
        families: dict[str, HwFamily] = self._part(
            f"hw:{tier}", (snap,), (node,), lambda: hw_families(node, tier, snap.samples, memo=self._memo(f"hw:{tier}"))
        )
        return families

    def _statuses(self, snaps: Mapping[str, TierSnapshot]) -> bytes:
        """The four collector status families, each with every tier's collectors (tiers in the view's order)."""
        lines = [self._status_tier(tier, snap) for tier, snap in snaps.items()]
        out: list[str] = []
        for i, (name, doc, typ, _) in enumerate(STATUS_FAMILIES):
            out.append(header(name, doc, typ))
            out.extend(tier_lines[i] for tier_lines in lines)
        return "".join(out).encode()

    def _status_tier(self, tier: str, snap: TierSnapshot) -> tuple[str, ...]:
        lines: tuple[str, ...] = self._part(
            f"collectors:{tier}", (snap,), (), lambda: status_lines(snap, self._memo(f"collectors:{tier}"))
        )
        return lines

    def _memo(self, part: str) -> SeriesLines:
        """The series lines of ``part``'s previous render (one per tier and part: a handful)."""
        memo = self._series.get(part)
        if memo is None:
            memo = self._series[part] = SeriesLines()
        return memo
