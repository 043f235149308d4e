"""The node_exporter surface in the agent: one core-tier collector per node_exporter collector, and its rendering.

Each node_exporter collector runs as its own core-tier collector (``node_exporter.<name>``), so it gets a worker
thread, the read timeout and the stuck-read skip of every other collector, and shares the cycle's file reads with
the ``nodevitals_hw_*`` collectors. It returns no samples to the rule engine (the hardware surface already does);
its families are its result of the cycle (``NodeResult``, held by the core tier's snapshot, not by the collector)
and are rendered from that snapshot on /metrics, with node_exporter's ``node_scrape_collector_*`` self metrics,
when ``nodeExporter.enabled``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nvdaemon.collectors.base import CYCLE_READS, Collector, Gathered, HostRoots, Interpreted, NotPresent
from nvdaemon.compat.node_exporter.context import NodeCollector, NodeContext
from nvdaemon.compat.node_exporter.family import LABEL_SETS, Family, merge, render
from nvdaemon.compat.node_exporter.options import enabled_collectors
from nvdaemon.supervise import describe

if TYPE_CHECKING:
    from nvdaemon.config import Config, NodeExporterConfig
    from nvdaemon.model import TierSnapshot

log = logging.getLogger(__name__)
PREFIX = "node_exporter."
TEXTFILE = "textfile"
_SCRAPE_ERROR = "node_textfile_scrape_error"
_TEXTFILE_OWN = {_SCRAPE_ERROR, "node_textfile_mtime_seconds"}  # the textfile collector's own families
# Families of the agent's own exposition that a textfile must not shadow.
_RESERVED = re.compile(r"^(nodevitals_|process_|python_|DCGM_|smartctl_|node_scrape_collector_)")


@dataclass
class _Collected:
    """What gather hands to interpret."""

    families: list[Family] = field(default_factory=list)
    success: bool = False


@dataclass(frozen=True)
class NodeResult(Interpreted):
    """One node_exporter collector's cycle: no samples for the rule engine, its families and whether it succeeded.

    The families are built by the gather of this cycle and never touched again (rendering copies what it merges).
    """

    families: tuple[Family, ...]
    success: bool

    def detail(self) -> dict[str, Any]:
        return {"nodeExporterSuccess": self.success, "families": len(self.families)}


class NodeExporterCollector(Collector):
    """Runs one node_exporter collector inside the core tier."""

    tier = "core"

    def __init__(self, node_name: str, impl: NodeCollector) -> None:
        self.node_name = node_name
        self.name = PREFIX + node_name  # type: ignore[misc]  # per-instance name: one class, many collectors
        self.impl = impl
        self.options: NodeExporterConfig | None = None

    def configure(self, config: Config) -> None:
        self.options = config.node_exporter

    def read_timeout(self, default: float) -> float:
        # filesystem gives up on a stuck statfs by itself after mountTimeoutSeconds and still reports the other
        # mounts; the tier's timeout must not cut that cycle off first.
        if self.node_name == "filesystem" and self.options is not None:
            return max(default, self.options.filesystem.mount_timeout_seconds + 1.0)
        return default

    def gather(self, roots: HostRoots) -> Gathered:
        from nvdaemon.config import NodeExporterConfig

        LABEL_SETS.cycle(CYCLE_READS.get())  # the first gather of a cycle starts a generation of label sets
        ctx = NodeContext(roots, self.options or NodeExporterConfig())
        out: list[Family] = []
        errors: list[str] = []
        success = False
        try:
            self.impl.collect(ctx, out)
            success = True
        except NotPresent as exc:  # node_exporter's ErrNoData: a failed collector, but not worth a warning
            log.debug("node_exporter collector %s: no data: %s", self.node_name, exc)
        except Exception as exc:
            errors.append(describe(exc))
        return Gathered(_Collected(out, success), ctx.errors + errors)

    def interpret(self, gathered: Gathered, now: float) -> NodeResult:
        collected: _Collected = gathered.data
        return NodeResult((), families=tuple(collected.families), success=collected.success)


def node_exporter_collectors(config: Config, table: Mapping[str, Callable[[], NodeCollector]]) -> list[Collector]:
    """Fresh core-tier collectors for the enabled node_exporter collectors (none when the surface is off)."""
    ne = config.node_exporter
    if not ne.enabled:
        return []
    return [NodeExporterCollector(name, table[name]()) for name in enabled_collectors(ne.collectors) if name in table]


def surface_families(snap: TierSnapshot) -> dict[str, Family]:
    """Every node_* family of a core cycle, with node_scrape_collector_{success,duration_seconds}."""
    success = Family("node_scrape_collector_success", "node_exporter: Whether a collector succeeded.", "gauge")
    duration = Family(
        "node_scrape_collector_duration_seconds", "node_exporter: Duration of a collector scrape.", "gauge"
    )
    own: list[Family] = []
    textfile: list[Family] = []
    for name, status in snap.collectors.items():
        if not name.startswith(PREFIX):
            continue
        node_name = name.removeprefix(PREFIX)
        # A result only when this cycle made one: none when the read timed out or was skipped.
        result = snap.results.get(name)
        fresh = result if isinstance(result, NodeResult) else None
        success.add(1.0 if fresh is not None and fresh.success else 0.0, collector=node_name)
        duration.add(status.duration, collector=node_name)  # the runner timed it (or the timeout)
        if fresh is not None:
            (textfile if node_name == TEXTFILE else own).extend(fresh.families)
    families = merge([*own, success, duration])
    if textfile:
        _merge_textfile(families, textfile)
    return families


def _merge_textfile(families: dict[str, Family], textfile: list[Family]) -> None:
    """Add textfile families, skipping those that collide with ours; a skip sets node_textfile_scrape_error 1."""
    collided = False
    for fam in textfile:
        if fam.name in families or _RESERVED.match(fam.name):
            log.warning("textfile: metric family %s collides with one the agent exports; skipped", fam.name)
            collided = True
    for fam in textfile:
        if fam.name in _TEXTFILE_OWN:
            samples = [(labels, 1.0) for labels, _ in fam.samples] if collided and fam.name == _SCRAPE_ERROR else None
            families[fam.name] = Family(fam.name, fam.help, fam.type, samples or list(fam.samples))
        elif fam.name not in families and not _RESERVED.match(fam.name):
            families[fam.name] = fam


def render_node_exporter(core: TierSnapshot | None, *, enabled: bool) -> bytes:
    """The node_* exposition of the core tier's latest snapshot ("" when the surface is off or has not run yet)."""
    if not enabled or core is None:
        return b""
    return render(surface_families(core))
