"""Our node_* surface against the real node_exporter on the same fixture host, one collector at a time."""

from __future__ import annotations

import pytest

from nvdaemon.compat.node_exporter.options import DEFAULTS
from tests.node_exporter.conftest import HOST_NAMES, HOSTS
from tests.node_exporter.oracle import compare, options_for, ours, theirs


@pytest.mark.parametrize("collector", sorted(DEFAULTS))
@pytest.mark.parametrize("host", HOST_NAMES)
def test_collector_matches_node_exporter(node_exporter_binary: str, host: str, collector: str) -> None:
    root = HOSTS / host
    options = options_for(root)
    their_text = theirs(root, options, [collector])
    diffs = compare(their_text, ours(root, options, [collector]))
    assert not diffs, f"{len(diffs)} difference(s) from node_exporter on {host}/{collector}:\n" + "\n".join(diffs)
    # The comparison is not vacuous: node_exporter reported this collector, so we did too.
    assert f'node_scrape_collector_success{{collector="{collector}"}}' in their_text
