"""Shared helpers for collector tests: the fixture hosts, copies of them to damage, and sample look-ups."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import strategies as st

from nvdaemon.collectors.base import Collector, Gathered, HostRoots
from nvdaemon.model import Labels, Sample, make_labels

HOSTS = Path(__file__).resolve().parents[2] / "fixtures" / "hosts"
HEALTHY = HostRoots.under(HOSTS / "healthy")
FAULTY = HostRoots.under(HOSTS / "faulty")
NOW = 1_733_140_123.5


def copy_host(tmp_path: Path, host: str = "healthy") -> HostRoots:
    """A private copy of a fixture host (relative symlinks kept as symlinks) that a test may damage."""
    dest = tmp_path / host
    shutil.copytree(HOSTS / host, dest, symlinks=True)
    return HostRoots.under(dest)


def collect(collector: Collector, roots: HostRoots, now: float = NOW) -> tuple[Gathered, list[Sample]]:
    gathered = collector.gather(roots)
    return gathered, list(collector.interpret(gathered, now).samples)


def find(samples: list[Sample], metric: str, device: str, **labels: str) -> Sample:
    """The one sample of that exact series; fails if it is missing or duplicated."""
    want: Labels = make_labels(labels)
    hits = [s for s in samples if s.metric == metric and s.device == device and s.labels == want]
    assert len(hits) == 1, f"{metric}{{{device}, {labels}}}: {len(hits)} samples"
    return hits[0]


def value(samples: list[Sample], metric: str, device: str, **labels: str) -> float:
    return find(samples, metric, device, **labels).value


def devices(samples: list[Sample], metric: str) -> set[str]:
    return {s.device for s in samples if s.metric == metric}


def fixture_text(host: str, rel: str) -> str:
    return (HOSTS / host / rel).read_text()


def damaged(text: str) -> st.SearchStrategy[str]:
    """Truncations of ``text``, optionally with arbitrary text spliced in at the cut: what a torn read looks like."""
    cut = st.integers(min_value=0, max_value=len(text))
    return st.one_of(
        cut.map(lambda n: text[:n]),
        st.tuples(cut, st.text(max_size=20), cut).map(lambda t: text[: t[0]] + t[1] + text[t[2] :]),
    )


@pytest.fixture
def healthy_copy(tmp_path: Path) -> HostRoots:
    return copy_host(tmp_path, "healthy")


@pytest.fixture
def faulty_copy(tmp_path: Path) -> HostRoots:
    return copy_host(tmp_path, "faulty")
