"""The fixture disks, the stand-in smartctl and its log, shared by the SMART tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvdaemon.collectors.base import Gathered, HostRoots
from nvdaemon.collectors.smart import SmartCollector
from nvdaemon.model import Sample

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "fixtures" / "smartctl" / "smartctl"
RECORDINGS = ROOT / "fixtures" / "smartctl" / "recordings"
DISKS = HostRoots.under(ROOT / "fixtures" / "hosts" / "disks")
DEVICES = ["sda", "sdb", "nvme0n1", "nvme1n1"]
NOW = 1_733_140_123.5


@dataclass
class Standin:
    """The stand-in's environment for one test: failure modes per device, and the log of what it was asked."""

    log: Path
    monkeypatch: pytest.MonkeyPatch

    def modes(self, **modes: str) -> None:
        self.monkeypatch.setenv("SMARTCTL_STANDIN_MODE", ",".join(f"{k}={v}" for k, v in modes.items()))

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def runs(self) -> list[list[str]]:
        """The argv (after the program name) of every run, in order."""
        return [line.split()[5:] for line in self.lines() if line.startswith("RUN ")]

    def clear(self) -> None:
        self.log.unlink(missing_ok=True)


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Standin]:
    log = tmp_path / "smartctl.log"
    monkeypatch.setenv("SMARTCTL_STANDIN_LOG", str(log))
    monkeypatch.delenv("SMARTCTL_STANDIN_MODE", raising=False)
    monkeypatch.delenv("SMARTCTL_STANDIN_DIR", raising=False)
    yield Standin(log, monkeypatch)


def collector(timeout: float = 10.0, concurrency: int = 4, devices: list[str] | None = None) -> SmartCollector:
    c = SmartCollector()
    c.smartctl_path = str(STANDIN)
    c.timeout = timeout
    c.concurrency = concurrency
    c.devices = devices or []
    return c


def cycle(c: SmartCollector, roots: HostRoots = DISKS) -> tuple[Gathered, list[Sample]]:
    gathered = c.gather(roots)
    return gathered, list(c.interpret(gathered, NOW).samples)


def by_series(samples: list[Sample]) -> dict[tuple[str, str], Sample]:
    out: dict[tuple[str, str], Sample] = {}
    for s in samples:
        assert (s.metric, s.device) not in out, f"duplicate {s.metric} {s.device}"
        out[(s.metric, s.device)] = s
    return out


def pid_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a reaped or killed-and-reparented process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


assert os.access(STANDIN, os.X_OK), "fixtures/smartctl/smartctl must be executable"
