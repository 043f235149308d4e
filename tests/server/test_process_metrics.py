"""The ``process_*`` families (``server/self_metrics.py``) against prometheus_client's ``ProcessCollector``, which
wrote them before: names, HELP, types, and the values that do not move between the two reads; and the open
descriptor count, from the directory's size where the kernel gives it, against a listing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from prometheus_client import ProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from nvdaemon.exposition import render
from nvdaemon.server.self_metrics import open_descriptors, process_metrics


@pytest.fixture
def many_open_files() -> Iterator[int]:
    """600 more descriptors, as the collectors hold on a GPU node."""
    with ExitStack() as stack:
        for _ in range(600):
            stack.callback(os.close, os.open("/proc/self/stat", os.O_RDONLY))
        yield 600


def test_the_open_descriptors_are_counted_as_a_listing_counts_them(many_open_files: int) -> None:
    listed = len(os.listdir("/proc/self/fd"))
    assert listed > many_open_files
    assert open_descriptors() == listed
    fd = os.open("/proc/self/stat", os.O_RDONLY)
    try:
        assert open_descriptors() == listed + 1
    finally:
        os.close(fd)


def test_a_kernel_without_the_count_in_the_directory_size_gets_the_listing() -> None:
    """/proc/self/fdinfo has one entry per descriptor too, and says size 0, as /proc/self/fd did before Linux 6.2."""
    assert os.stat("/proc/self/fdinfo").st_size == 0
    assert open_descriptors("/proc/self/fdinfo") == len(os.listdir("/proc/self/fdinfo"))


def test_the_families_are_those_prometheus_client_wrote(many_open_files: int) -> None:
    theirs = {m.name: m for m in ProcessCollector(registry=None).collect()}
    ours = {m.name: m for m in text_string_to_metric_families(render(process_metrics()))}
    assert sorted(ours) == sorted(theirs)
    for name, family in ours.items():
        assert (family.type, family.documentation) == (theirs[name].type, theirs[name].documentation), name
        assert len(family.samples) == 1 and family.samples[0].name == theirs[name].samples[0].name
    for name in ("process_open_fds", "process_max_fds", "process_start_time_seconds"):
        assert ours[name].samples[0].value == theirs[name].samples[0].value, name
    assert ours["process_open_fds"].samples[0].value > many_open_files
