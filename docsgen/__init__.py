"""The generated reference pages: ``docs/config.md`` from the config schema, ``docs/metrics.md`` from the metric
catalogue and the agent's own exposition.

``python -m docsgen`` (``make docs``) writes both; ``tests/test_docs_generated.py`` fails when the committed pages
differ from what the code generates. Nothing in ``nvdaemon`` imports this package: it only reads the agent's code.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def generate() -> dict[str, str]:
    """Every generated page by its path relative to the repository root, as text."""
    from docsgen.config_page import config_page
    from docsgen.metrics_page import metrics_page

    return {"docs/config.md": config_page(), "docs/metrics.md": metrics_page()}


__all__ = ["ROOT", "generate"]
