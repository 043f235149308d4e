"""A core tick with the node_* surface, and the gzip render after it, leave nothing to the cycle collector.

``nvdaemon run`` raises the youngest generation's threshold (``cli.GC_YOUNG_THRESHOLD``) so that the collector stops
walking a tick's live objects three times a tick; what that threshold bounds is cyclic garbage waiting to be
collected, and this is where it would come from. A reference cycle made per tick (an exception kept with its
traceback, a cache entry that points back at its cache) fails here, with the count. Runs ``bench/tick.py``'s own
measurement on a copy of gpunode, so the benchmark's figure and this check cannot drift apart. No timing is
asserted.
"""

from __future__ import annotations

import gc
from pathlib import Path

from bench import tick
from bench.common import gpunode_with_disks


def test_a_tick_and_its_render_leave_no_reference_cycles(tmp_path: Path) -> None:
    before = gc.get_threshold()
    raw = tick.measure(gpunode_with_disks(tmp_path / "host"), tmp_path / "state", ticks_measured=2)
    assert raw["tick_files_read"] > 400  # the whole surface ran: gpunode's hwmon, netclass, cpufreq...
    assert raw["tick_garbage_objects_per_tick"] == 0
    # With the agent's threshold, a tick's live objects stay below it: no collection of the youngest generation in
    # two ticks and renders (six at CPython's 700).
    assert raw["tick_gc_collections_per_tick"][0] == 0, raw["tick_gc_collections_per_tick"]
    assert gc.get_threshold() == before  # the measurement put the test process's collector back
    assert gc.get_freeze_count() == 0
