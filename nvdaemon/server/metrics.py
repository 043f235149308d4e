"""``/metrics``: a collector over the latest snapshots, on a registry of its own (never the global REGISTRY).

Hardware samples are exposed as ``nodevitals_hw_<metric>{node,tier,device,<labels sorted>}``. The text is rendered
once per change (a new snapshot or new events) and served from that cache: a scrape storm costs one render.

Two self metrics carry the Go agent's label sets exactly (nodevitals-contract.md §2):
``nodevitals_events_total{node,tier,device,condition,severity,phase,xid}`` counts emitted events (``xid`` empty but
for XIDs); ``nodevitals_delivery_dropped_total{sink}`` counts the events each sink lost, summed over reasons: for a
webhook, ``sink`` is ``webhook:<scheme>://<host[:port]>`` as Go writes it (path, query and credentials cut) and the
count is its spool drops and dead letters plus what it lost on the bus; for the stream hub, NVSentinel and history,
``sink`` is the sink's name and the count what it lost on the bus. The counts start again when a sink is rebuilt
(a reload that changed it), which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from nvdaemon import __version__
from nvdaemon.catalogue import help_for
from nvdaemon.compat.dcgm import pod_attributes, render_dcgm
from nvdaemon.compat.node_exporter.surface import render_node_exporter
from nvdaemon.compat.smartctl import render_smartctl
from nvdaemon.gpu.podresources import podresources_metrics
from nvdaemon.model import COUNT_LABELS, Kind
from nvdaemon.server.smart_metrics import smart_self_metrics
from nvdaemon.server.tier_metrics import tier_self_metrics

if TYPE_CHECKING:
    from nvdaemon.view import AgentView

PREFIX = "nodevitals_hw_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def exposed_as_counter(metric: str, kind: Kind) -> bool:
    """TYPE counter only for a counter sample whose name already ends in ``_total``.

    prometheus_client appends ``_total`` to a counter family's samples, which would rename a series (the Go agent
    never does: its smart tier's ``smart_power_on_hours`` is a gauge); any other sample is exposed as a gauge.
    """
    return kind is Kind.COUNTER and metric.endswith("_total")


class SnapshotCollector(Collector):
    def __init__(self, view: AgentView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        yield from self._hardware()
        yield from self._self_metrics()

    def _hardware(self) -> Iterator[Metric]:
        node = self.view.node
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for tier, snap in sorted(self.view.snapshots.items()):
            for s in snap.samples:
                fam = families.get(s.metric)
                if fam is None:
                    name = PREFIX + s.metric
                    fam_cls = CounterMetricFamily if exposed_as_counter(s.metric, s.kind) else GaugeMetricFamily
                    fam = fam_cls(
                        name, help_for(s.metric), labels=["node", "tier", "device", *(k for k, _ in s.labels)]
                    )
                    families[s.metric] = fam
                fam.add_metric([node, tier, s.device, *(v for _, v in s.labels)], s.value)
        for metric in sorted(families):
            yield families[metric]

    def _self_metrics(self) -> Iterator[Metric]:
        view = self.view
        success = GaugeMetricFamily(
            "nodevitals_collector_success",
            "1 if the collector's last run had no error (an absent source is not one).",
            labels=["collector"],
        )
        present = GaugeMetricFamily(
            "nodevitals_collector_present", "1 if the collector's source exists on this node.", labels=["collector"]
        )
        duration = GaugeMetricFamily(
            "nodevitals_collector_duration_seconds", "Wall time of the collector's last run.", labels=["collector"]
        )
        errors = CounterMetricFamily(
            "nodevitals_collector_errors",
            "Errors met by the collector since start (partial failures included).",
            labels=["collector"],
        )
        for snap in view.snapshots.values():
            for name, st in sorted(snap.collectors.items()):
                success.add_metric([name], 1.0 if st.success else 0.0)
                present.add_metric([name], 1.0 if st.present else 0.0)
                duration.add_metric([name], st.duration)
                errors.add_metric([name], st.error_total)
        yield from (success, present, duration, errors)
        # nodevitals_smart_device_readable{device}: a disk the smart tier could not read is not silent.
        yield from smart_self_metrics(view.snapshots)
        yield from tier_self_metrics(view.snapshots, view.interval)  # a stuck tier loop, for alerts (as /healthz)
        yield from podresources_metrics(view.gpu)  # GPU pod attribution: kubelet reachable, failures by reason

        events = CounterMetricFamily("nodevitals_events", "Events emitted, by transition.", labels=list(COUNT_LABELS))
        for event_key, n in sorted(view.event_counts.items()):
            events.add_metric(list(event_key), n)
        yield events
        yield delivery_dropped(view)
        dropped = CounterMetricFamily(
            "nodevitals_bus_dropped", "Events a subscriber lost because its channel was full.", labels=["subscriber"]
        )
        for name, n in sorted(view.bus.drop_totals.items()):
            dropped.add_metric([name], n)
        yield dropped
        active = GaugeMetricFamily(
            "nodevitals_conditions_active",
            "Conditions currently active.",
            labels=["tier", "condition", "severity", "stale"],
        )
        counts: dict[tuple[str, str, str, str], int] = {}
        for c in view.engine.active.values():
            key = (c.tier, c.condition, c.severity, "true" if c.stale else "false")
            counts[key] = counts.get(key, 0) + 1
        for key, n in sorted(counts.items()):
            active.add_metric(list(key), n)
        yield active
        if view.tasks:
            restarts = CounterMetricFamily(
                "nodevitals_task_restarts", "Restarts of a supervised task.", labels=["task"]
            )
            up = GaugeMetricFamily("nodevitals_task_up", "1 if the supervised task is running.", labels=["task"])
            for name, task in sorted(view.tasks.items()):
                restarts.add_metric([name], task.restarts)
                up.add_metric([name], 1.0 if task.state == "running" else 0.0)
            yield from (restarts, up)
        reloads = CounterMetricFamily(
            "nodevitals_config_reloads",
            "Config reloads (SIGHUP) by result: ok, or rejected (the running config kept).",
            labels=["result"],
        )
        reloads.add_metric(["ok"], view.reloads)
        reloads.add_metric(["rejected"], view.reload_failures)
        last_ok = GaugeMetricFamily(
            "nodevitals_config_last_reload_successful", "0 if the last reload was rejected, else 1."
        )
        last_ok.add_metric([], 1.0 if view.last_reload_ok else 0.0)
        yield from (reloads, last_ok)
        writable = GaugeMetricFamily(
            "nodevitals_sink_state_writable",
            "1 if the sink's last write to stateDir succeeded, 0 while stateDir refuses it (full, read-only).",
            labels=["sink"],
        )
        for name, sink in sorted(view.sinks.items()):
            if (ok := sink.state_writable()) is not None:
                writable.add_metric([name], 1.0 if ok else 0.0)
        if writable.samples:  # only where a sink keeps state (the webhook spool)
            yield writable
        # Several webhook endpoints each report the same families: one family per name, or the exposition is invalid.
        merged: dict[str, Metric] = {}
        for sink in view.sinks.values():
            for fam in sink.metrics():
                if (first := merged.setdefault(fam.name, fam)) is not fam:
                    first.samples.extend(fam.samples)
        yield from merged.values()
        info = GaugeMetricFamily("nodevitals_build_info", "Version of the agent; always 1.", labels=["version"])
        info.add_metric([__version__], 1.0)
        yield info


def go_sink_label(url: str) -> str:
    """``webhook:<scheme>://<host>`` as the Go agent names an endpoint: Go's ``url.URL.Host``, so the port stays
    when the URL has one and the host keeps its spelling; userinfo, path, query and fragment are cut."""
    parts = urllib.parse.urlsplit(url)
    return f"webhook:{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def delivery_dropped(view: AgentView) -> CounterMetricFamily:
    """``nodevitals_delivery_dropped_total{sink}``: one row per sink, zeros included (see the module docstring)."""
    totals: dict[str, float] = {}
    for name, sink in view.sinks.items():
        label, lost = name, float(view.bus.drop_totals.get(name, 0) + sum(sink.dropped_counts().values()))
        if name.startswith("webhook:"):
            from nvdaemon.sinks.webhook import WebhookEndpoint  # already loaded: the sink was built from it

            if isinstance(sink, WebhookEndpoint):
                label = go_sink_label(sink.hook.url)
        # Two endpoints on one host share a Go label, as they share Go's counter.
        totals[label] = totals.get(label, 0.0) + lost
    fam = CounterMetricFamily(
        "nodevitals_delivery_dropped",
        "Events a sink dropped: spool overflow, dead letters and bus overflow, summed over reasons.",
        labels=["sink"],
    )
    for label, n in sorted(totals.items()):
        fam.add_metric([label], n)
    return fam


class MetricsCache:
    """Owns the registry; re-renders only when what the view shows changed since the last render."""

    def __init__(self, view: AgentView) -> None:
        self.view = view
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(view))
        self.registry.register(ProcessCollector(registry=None))
        self._key: tuple[int, int, int, int] | None = None
        self._body = b""
        self.renders = 0

    def render(self) -> bytes:
        view = self.view
        key = (view.snapshot_version, view.bus.published, view.reloads, view.changes)
        if key != self._key:
            # The drop-in surfaces are rendered as text: their exact names would be rewritten by prometheus_client.
            on, rt, snaps = view.surfaces, view.gpu, view.snapshots
            pa = rt.pod_attribution if rt is not None else None
            self._body = (
                generate_latest(self.registry)
                + render_dcgm(
                    snaps.get("gpu"),
                    enabled=on.dcgm,
                    node=view.node,
                    last_xid=rt.last_xid if rt is not None else {},
                    pods=pod_attributes(pa.current if pa is not None else None),
                )
                + render_smartctl(snaps.get("smart"), enabled=on.smartctl)
                + render_node_exporter(snaps.get("core"), enabled=on.node_exporter)
            )
            self._key = key
            self.renders += 1
        return self._body
