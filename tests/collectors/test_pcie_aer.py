from __future__ import annotations

from pathlib import Path

import pytest

from nvdaemon.collectors.base import HostRoots
from nvdaemon.collectors.pcie_aer import PcieAerCollector, parse_aer
from nvdaemon.model import Kind
from tests.collectors.conftest import FAULTY, HEALTHY, collect, devices, find, value

GPU = "0000:3b:00.0"
AER_DEVICES = {"0000:00:1d.0", "0000:02:00.0", "0000:3a:00.0", GPU}  # 0000:00:1f.0 has no AER capability


def test_healthy_all_zero() -> None:
    gathered, samples = collect(PcieAerCollector(), HEALTHY)
    assert gathered.errors == []
    assert devices(samples, "pcie_aer_fatal_total") == AER_DEVICES
    # Zeros are emitted: every line of every file is a series, the TOTAL_ERR_* line included (as in Go).
    assert all(s.value == 0 for s in samples)
    assert all(s.kind is Kind.COUNTER for s in samples)
    assert {s.metric for s in samples} == {
        "pcie_aer_correctable_total",
        "pcie_aer_nonfatal_total",
        "pcie_aer_fatal_total",
    }
    assert all([k for k, _ in s.labels] == ["error_type"] for s in samples)
    on_gpu = [s for s in samples if s.device == GPU]
    assert len([s for s in on_gpu if s.metric == "pcie_aer_correctable_total"]) == 8 + 1
    assert len([s for s in on_gpu if s.metric == "pcie_aer_nonfatal_total"]) == 17 + 1
    assert len([s for s in on_gpu if s.metric == "pcie_aer_fatal_total"]) == 17 + 1
    assert find(samples, "pcie_aer_correctable_total", GPU, error_type="TOTAL_ERR_COR").value == 0


def test_faulty_gpu_has_a_fatal_error() -> None:
    _, samples = collect(PcieAerCollector(), FAULTY)
    assert value(samples, "pcie_aer_fatal_total", GPU, error_type="TOTAL_ERR_FATAL") == 1
    assert value(samples, "pcie_aer_fatal_total", GPU, error_type="SDES") == 1
    assert value(samples, "pcie_aer_fatal_total", GPU, error_type="DLP") == 0
    assert value(samples, "pcie_aer_nonfatal_total", GPU, error_type="TOTAL_ERR_NONFATAL") == 2
    assert value(samples, "pcie_aer_nonfatal_total", GPU, error_type="CmpltTO") == 2
    assert value(samples, "pcie_aer_correctable_total", GPU, error_type="TOTAL_ERR_COR") == 16
    assert value(samples, "pcie_aer_correctable_total", GPU, error_type="RxErr") == 12
    assert value(samples, "pcie_aer_correctable_total", GPU, error_type="BadTLP") == 3
    assert value(samples, "pcie_aer_correctable_total", "0000:3a:00.0", error_type="TOTAL_ERR_COR") == 3
    assert value(samples, "pcie_aer_fatal_total", "0000:3a:00.0", error_type="TOTAL_ERR_FATAL") == 0


def test_a_file_without_its_total_line_gives_its_lines(faulty_copy: HostRoots) -> None:
    """The Go agent's own test files have no TOTAL_ line: every line is still a series, nothing is invented."""
    path = faulty_copy.sys / "bus" / "pci" / "devices" / GPU / "aer_dev_fatal"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:5]))  # cut before TOTAL_ERR_FATAL
    gathered, samples = collect(PcieAerCollector(), faulty_copy)
    assert gathered.errors == []
    fatal = {
        dict(s.labels)["error_type"]: s.value for s in samples if s.metric == "pcie_aer_fatal_total" and s.device == GPU
    }
    assert fatal == {"Undefined": 0, "DLP": 0, "SDES": 1, "TLP": 0, "FCP": 0}
    assert value(samples, "pcie_aer_correctable_total", GPU, error_type="TOTAL_ERR_COR") == 16


def test_go_agent_test_values(tmp_path: Path) -> None:
    """The Go agent's test device: 4 correctable + 3 nonfatal + 2 fatal lines, zeros present."""
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:01.1"
    device.mkdir(parents=True)
    (device / "aer_dev_correctable").write_text("RxErr 0\nBadTLP 3\nBadDLLP 0\nRollover 0\n")
    (device / "aer_dev_nonfatal").write_text("Undefined 0\nDLP 1\nSDES 0\n")
    (device / "aer_dev_fatal").write_text("Undefined 0\nDLP 0\n")
    gathered, samples = collect(PcieAerCollector(), HostRoots.under(tmp_path))
    assert gathered.errors == [] and len(samples) == 9
    assert value(samples, "pcie_aer_correctable_total", "0000:00:01.1", error_type="BadTLP") == 3
    assert value(samples, "pcie_aer_correctable_total", "0000:00:01.1", error_type="RxErr") == 0
    assert value(samples, "pcie_aer_nonfatal_total", "0000:00:01.1", error_type="DLP") == 1
    assert value(samples, "pcie_aer_fatal_total", "0000:00:01.1", error_type="DLP") == 0


def test_a_malformed_line_is_skipped_and_counted_the_rest_of_the_file_kept(faulty_copy: HostRoots) -> None:
    """As in the Go agent, one odd line (a bad number here) never costs the file's other counters."""
    path = faulty_copy.sys / "bus" / "pci" / "devices" / GPU / "aer_dev_fatal"
    path.write_text(path.read_text().replace("SDES 1", "SDES one"))
    gathered, samples = collect(PcieAerCollector(), faulty_copy)
    assert len(gathered.errors) == 1
    assert f"{GPU}/aer_dev_fatal" in gathered.errors[0] and "SDES" in gathered.errors[0]
    fatal = {dict(s.labels)["error_type"] for s in samples if s.metric == "pcie_aer_fatal_total" and s.device == GPU}
    assert "SDES" not in fatal and {"DLP", "TOTAL_ERR_FATAL"} <= fatal
    assert value(samples, "pcie_aer_fatal_total", GPU, error_type="TOTAL_ERR_FATAL") == 1
    assert value(samples, "pcie_aer_correctable_total", GPU, error_type="TOTAL_ERR_COR") == 16
    assert devices(samples, "pcie_aer_fatal_total") == AER_DEVICES


def test_go_agent_malformed_lines(tmp_path: Path) -> None:
    """The Go agent's own case: a blank line, a name without a count and a bad number are skipped, 2 lines kept."""
    device = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:01.1"
    device.mkdir(parents=True)
    (device / "aer_dev_correctable").write_text("\nTOTAL_ERR_COR\nRxErr 4\nBadTLP notanumber\nBadDLLP 1\n")
    gathered, samples = collect(PcieAerCollector(), HostRoots.under(tmp_path))
    assert {dict(s.labels)["error_type"]: s.value for s in samples} == {"RxErr": 4, "BadDLLP": 1}
    assert len(gathered.errors) == 2 and all("aer_dev_correctable" in e for e in gathered.errors)


def test_parse_exact() -> None:
    counts, skipped = parse_aer("RxErr 2\nERR_COR_bit[12] 1\nTOTAL_ERR_COR 3\n", "TOTAL_ERR_COR")
    assert list(counts.items()) == [("RxErr", 2), ("ERR_COR_bit[12]", 1), ("TOTAL_ERR_COR", 3)] and skipped == []
    assert parse_aer("RxErr 1\n", "TOTAL_ERR_COR") == ({"RxErr": 1}, [])


@pytest.mark.parametrize(
    ("text", "kept", "n_skipped"),
    [
        ("RxErr one\nTOTAL_ERR_COR 1\n", {"TOTAL_ERR_COR": 1}, 1),
        ("TOTAL_ERR_FATAL 1\nTOTAL_ERR_COR 1\n", {"TOTAL_ERR_COR": 1}, 1),  # the wrong file's total line
        ("RxErr\nTOTAL_ERR_COR 0\n", {"TOTAL_ERR_COR": 0}, 1),
        ("header line\nRxErr 2\n\nBadTLP 3\n", {"RxErr": 2, "BadTLP": 3}, 1),
    ],
)
def test_parse_skips_bad_lines(text: str, kept: dict[str, int], n_skipped: int) -> None:
    counts, skipped = parse_aer(text, "TOTAL_ERR_COR")
    assert counts == kept and len(skipped) == n_skipped
