"""The ``process_*`` families (``server/self_metrics.py``) against prometheus_client's ``ProcessCollector``, which
wrote them before: names, HELP, types, and the values that do not move between the two reads; and the open
descriptor count, from the directory's size where the kernel gives it, against a listing.

Counts are compared in a fresh interpreter with no other thread: in the test process, threads left by other tests
open and close descriptors between two counts (and the kernel counts a descriptor being opened in the directory's
size before the listing shows it)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from prometheus_client import ProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from nvdaemon.exposition import render
from nvdaemon.server.self_metrics import process_metrics

COUNTS = r"""
import json, os
from prometheus_client import ProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from nvdaemon.exposition import render
from nvdaemon.server.self_metrics import open_descriptors, process_metrics

held = [os.open("/proc/self/stat", os.O_RDONLY) for _ in range(600)]  # as the collectors hold on a GPU node
out = {"listed": len(os.listdir("/proc/self/fd")), "counted": open_descriptors()}
fd = os.open("/proc/self/stat", os.O_RDONLY)
out["one_more"] = open_descriptors()
os.close(fd)
out["fdinfo_size"] = os.stat("/proc/self/fdinfo").st_size
out["fdinfo_listed"] = len(os.listdir("/proc/self/fdinfo"))
out["fdinfo_counted"] = open_descriptors("/proc/self/fdinfo")
ours = {m.name: m.samples[0].value for m in text_string_to_metric_families(render(process_metrics()))}
theirs = {m.name: m.samples[0].value for m in ProcessCollector(registry=None).collect()}
out["ours"], out["theirs"] = ours["process_open_fds"], theirs["process_open_fds"]
print(json.dumps(out))
"""


def counts() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", COUNTS], capture_output=True, text=True, check=True, timeout=60)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_the_open_descriptors_are_counted_as_a_listing_counts_them() -> None:
    got = counts()
    assert got["listed"] > 600
    assert got["counted"] == got["listed"]
    assert got["one_more"] == got["listed"] + 1
    assert got["ours"] == got["theirs"] == got["listed"]  # prometheus_client's process_open_fds, the same way


def test_a_kernel_without_the_count_in_the_directory_size_gets_the_listing() -> None:
    """/proc/self/fdinfo has one entry per descriptor too, and says size 0, as /proc/self/fd did before Linux 6.2."""
    got = counts()
    assert got["fdinfo_size"] == 0
    assert got["fdinfo_counted"] == got["fdinfo_listed"] > 600


def test_the_families_are_those_prometheus_client_wrote() -> None:
    theirs = {m.name: m for m in ProcessCollector(registry=None).collect()}
    ours = {m.name: m for m in text_string_to_metric_families(render(process_metrics()))}
    assert sorted(ours) == sorted(theirs)
    for name, family in ours.items():
        assert (family.type, family.documentation) == (theirs[name].type, theirs[name].documentation), name
        assert len(family.samples) == 1 and family.samples[0].name == theirs[name].samples[0].name
    for name in ("process_max_fds", "process_start_time_seconds"):
        assert ours[name].samples[0].value == theirs[name].samples[0].value, name
    assert ours["process_open_fds"].samples[0].value >= 3  # the count itself: in a process of its own, above
