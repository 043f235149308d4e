"""The agent's own families in ``/metrics`` (after the hardware and tier ones), the sinks' families, and the
process's (``process_*``, as prometheus_client's ProcessCollector exposed them).

``process_metrics`` reads ``/proc/self/stat`` (virtual size in bytes, resident pages, start time and CPU time in
clock ticks), ``/proc/self/limits`` (the open-files limit), counts the open descriptors (``open_descriptors``), and
reads ``btime`` (Unix seconds) from ``/proc/stat`` once; the agent's own process, never the host root's. Without
``/proc`` there are none.
"""

from __future__ import annotations

import os
import resource
import urllib.parse
from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING

from nvdaemon import __version__
from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, Metric, render
from nvdaemon.gpu.podresources import podresources_metrics
from nvdaemon.model import COUNT_LABELS
from nvdaemon.view import webhook_targets

if TYPE_CHECKING:
    from nvdaemon.view import AgentView

_info = GaugeMetricFamily("nodevitals_build_info", "Version of the agent; always 1.", labels=["version"])
_info.add_metric([__version__], 1.0)
BUILD_INFO = render([_info]).encode()


def self_metrics(view: AgentView) -> Iterator[Metric]:
    """From the pod attribution to the sinks' stateDir (the sinks' own families are ``sink_metrics``)."""
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
        restarts = CounterMetricFamily("nodevitals_task_restarts", "Restarts of a supervised task.", labels=["task"])
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


def sink_metrics(view: AgentView) -> Iterator[Metric]:
    """Every sink's families; several webhook endpoints each report the same families: one family per name, or
    the exposition is invalid."""
    merged: dict[str, Metric] = {}
    for sink in view.sinks.values():
        for fam in sink.metrics():
            if (first := merged.setdefault(fam.name, fam)) is not fam:
                first.samples.extend(fam.samples)
    yield from merged.values()


def go_sink_label(url: str) -> str:
    """``webhook:<scheme>://<host>`` as the Go agent names an endpoint: Go's ``url.URL.Host``, so the port stays
    when the URL has one and the host keeps its spelling; userinfo, path, query and fragment are cut."""
    parts = urllib.parse.urlsplit(url)
    return f"webhook:{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def delivery_dropped(view: AgentView) -> CounterMetricFamily:
    """``nodevitals_delivery_dropped_total{sink}``: one row per sink, zeros included (``nvdaemon/server/metrics.py``
    says what is counted)."""
    totals: dict[str, float] = {}
    urls = webhook_targets(view)
    for name, sink in view.sinks.items():
        lost = float(view.bus.drop_totals.get(name, 0) + sum(sink.dropped_counts().values()))
        label = go_sink_label(urls[name]) if name in urls else name
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


@cache
def _boot_time() -> float | None:
    """``btime`` of /proc/stat, Unix seconds; None without it. Read once: it is fixed from boot (and /proc/stat, with
    a line per CPU, is the dearest file here to render)."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def open_descriptors(fd_dir: str = "/proc/self/fd") -> int:
    """The process's open file descriptors, as ``len(os.listdir(fd_dir))`` counts them (prometheus_client's way:
    the listing's own descriptor included). Since Linux 6.2 the directory's ``st_size`` is the count, without the
    listing: the collectors hold their host files open, some 600 on a GPU node, and listing them cost 0.22 ms a
    render on the 2-CPU test machine. An older kernel says 0: then the listing."""
    count = os.stat(fd_dir).st_size
    return count + 1 if count > 0 else len(os.listdir(fd_dir))


def process_metrics() -> list[Metric]:
    """The agent process's memory, start time, CPU time and file descriptors (module docstring)."""
    btime = _boot_time()
    if not btime:
        return []
    ticks = os.sysconf("SC_CLK_TCK")
    result: list[Metric] = []
    try:
        with open("/proc/self/stat", "rb") as f:
            parts = f.read().split(b")")[-1].split()
        result += [
            GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.", float(parts[20])),
            GaugeMetricFamily(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                float(parts[21]) * resource.getpagesize(),
            ),
            GaugeMetricFamily(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                float(parts[19]) / ticks + btime,
            ),
            CounterMetricFamily(
                "process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.",
                float(parts[11]) / ticks + float(parts[12]) / ticks,
            ),
        ]
    except OSError:
        pass
    try:
        with open("/proc/self/limits", "rb") as f:
            max_fds = next((float(line.split()[3]) for line in f if line.startswith(b"Max open file")), None)
        open_fds = open_descriptors()
        if max_fds is not None:
            result += [
                GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", open_fds),
                GaugeMetricFamily("process_max_fds", "Maximum number of open file descriptors.", max_fds),
            ]
    except OSError:
        pass
    return result
