"""The node_exporter drop-in surface: node_exporter's ``node_*`` families, implemented natively.

``TABLE`` maps each node_exporter collector name to a factory of its implementation. Each lives in one module of
this package (``MODULES`` names it) that defines either ``collect(ctx, out)`` (stateless) or ``make()`` returning
an object with that method (state kept between cycles). ``options.DEFAULTS`` says which are on by default;
``surface`` runs them inside the core tier and renders them on /metrics. The real node_exporter on the same host
root is the oracle (tests/node_exporter).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial

from nvdaemon.compat.node_exporter.context import FunctionCollector, NodeCollector
from nvdaemon.compat.node_exporter.options import DEFAULTS

# node_exporter collector name -> module; three are renamed so no module shadows the standard library's.
MODULES: dict[str, str] = {name: name for name in DEFAULTS} | {"time": "clock", "os": "osrelease", "stat": "procstat"}


def _make(name: str) -> NodeCollector:
    module = importlib.import_module(f"{__name__}.{MODULES[name]}")
    make = getattr(module, "make", None)
    if make is not None:
        impl: NodeCollector = make()
        return impl
    return FunctionCollector(module.collect)


TABLE: dict[str, Callable[[], NodeCollector]] = {name: partial(_make, name) for name in DEFAULTS}

__all__ = ["MODULES", "TABLE"]
