"""The node_exporter drop-in surface: node_exporter's ``node_*`` families, implemented natively.

``TABLE`` maps each node_exporter collector name to a factory of its implementation (one module per collector,
``collect(ctx, out)``); ``options.DEFAULTS`` says which are on by default. ``surface`` runs them inside the core tier
and renders them on /metrics. The real node_exporter on the same host root is the oracle (tests/node_exporter).
"""

from __future__ import annotations

from collections.abc import Callable

from nvdaemon.compat.node_exporter import loadavg
from nvdaemon.compat.node_exporter.context import FunctionCollector, NodeCollector

TABLE: dict[str, Callable[[], NodeCollector]] = {
    "loadavg": lambda: FunctionCollector(loadavg.collect),
}

__all__ = ["TABLE"]
