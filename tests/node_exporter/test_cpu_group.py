"""cpu, cpufreq, stat, schedstat and pressure: parser tables, bad input, the cpu collector's state across scrapes,
and node_exporter itself on host roots built in ``tmp_path`` (each variant: same series, same success value)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import msgspec
import pytest

from nvdaemon.collectors.base import HostRoots, ParseError
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.cpu import CpuCollector, parse_isolated
from nvdaemon.compat.node_exporter.family import Family, merge, render
from nvdaemon.compat.node_exporter.pressure import parse_psi
from nvdaemon.compat.node_exporter.procstat import parse_stat, sscanf
from nvdaemon.compat.node_exporter.schedstat import parse_schedstat
from nvdaemon.config import NodeExporterConfig
from tests.node_exporter.conftest import HOSTS
from tests.node_exporter.oracle import compare, flags_for, node_exporter, options_for, ours, scrape, theirs

GROUP = ["cpu", "cpufreq", "stat", "schedstat", "pressure"]
GPUNODE = HOSTS / "gpunode"
CPU_DIR = "sys/devices/system/cpu"
STAT = (
    "cpu  40 0 20 1000 5 0 1 0 0 0\n"
    "cpu0 20 0 10 500 2 0 1 0 0 0\n"
    "cpu1 20 0 10 500 3 0 0 0 0 0\n"
    "intr 500 1 2 3\nctxt 900\nbtime 1700000000\nprocesses 77\nprocs_running 2\nprocs_blocked 1\n"
    "softirq 10 1 1 1 1 1 1 1 1 1 1\n"
)


def gpunode_copy(tmp_path: Path) -> Path:
    """The group's part of gpunode (proc/stat, schedstat, pressure, the sysfs CPU tree), links kept."""
    root = tmp_path / "host"
    for rel in ("proc/pressure", CPU_DIR):
        shutil.copytree(GPUNODE / rel, root / rel, symlinks=True)
    for rel in ("proc/stat", "proc/schedstat"):
        shutil.copy(GPUNODE / rel, root / rel)
    return root


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.is_file():
        path.unlink()
    path.write_text(text)


def context(root: Path) -> NodeContext:
    return NodeContext(HostRoots.under(root), msgspec.convert({"enabled": True}, NodeExporterConfig))


def against_node_exporter(root: Path, collectors: list[str] | None = None) -> str:
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "sys").mkdir(parents=True, exist_ok=True)
    names = collectors or GROUP
    options = options_for(root)
    their_text = theirs(root, options, names)
    diffs = compare(their_text, ours(root, options, names))
    assert not diffs, "\n".join(diffs)
    return their_text


def succeeded(text: str, collector: str) -> bool:
    return f'node_scrape_collector_success{{collector="{collector}"}} 1' in text


# --- parsers -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "fmt", "partial", "want"),
    [
        ("cpu0 1 2 3", "%s %f %f %f %f", True, ["cpu0", 1.0, 2.0, 3.0]),
        ("cpu0 1.5 -2e1 +.5", "%s %f %f %f", False, ["cpu0", 1.5, -20.0, 0.5]),
        ("cpu0  1\t2 7junk", "%s %f %f %f", False, ["cpu0", 1.0, 2.0, 7.0]),  # junk after the last verb is fine
        ("x 1p3", "%s %f", False, ["x", 8.0]),  # fmt's decimal mantissa with binary exponent
        ("x -1p99999", "%s %f", False, ["x", -math.inf]),  # Ldexp overflows to an infinity, no error
        # Go's literal syntax, as ParseFloat takes it: node_exporter accepts "cpu0 6_660_235 0x1p3 ..." in /proc/stat
        ("cpu0 1_000 0x1p3", "%s %f %f", False, ["cpu0", 1000.0, 8.0]),
        (
            "some avg10=0.10 avg60=0 avg300=1 total=5x",
            "some avg10=%f avg60=%f avg300=%f total=%d",
            False,
            [0.1, 0.0, 1.0, 5],
        ),
    ],
)
def test_sscanf_accepts(line: str, fmt: str, partial: bool, want: list[object]) -> None:
    assert sscanf(line, fmt, partial=partial) == want


@pytest.mark.parametrize(
    ("line", "fmt"),
    [
        ("cpu0 1 2", "%s %f %f %f"),  # ran out, not partial
        ("cpu0 1x 2", "%s %f %f"),  # junk before the next verb
        ("cpu0 1e999", "%s %f"),  # out of range
        ("softirq -1", "%s %d"),  # no sign for an unsigned verb
        ("softirq 18446744073709551616", "%s %d"),  # 2**64
        ("some avg10=1 avg60=2", "full avg10=%f avg60=%f"),  # literal mismatch
    ],
)
def test_sscanf_refuses(line: str, fmt: str) -> None:
    with pytest.raises(ValueError):
        sscanf(line, fmt)


def test_parse_stat_values_and_gaps() -> None:
    stat = parse_stat("cpu 1 2 3 4\ncpu0 100 0 50 1000\ncpu2 1 2 3 4 5 6 7 8 9 10 11\nbtime\nctxt 5\n")
    assert len(stat.cpus) == 3  # cpu1 is offline: a gap of zeros, as procfs pads the slice
    assert stat.cpus[0][:4] == (1.0, 0.0, 0.5, 10.0) and stat.cpus[0][4:] == (0.0,) * 6
    assert stat.cpus[1] == (0.0,) * 10
    assert stat.cpus[2] == tuple(v / 100 for v in range(1, 11))
    assert (stat.ctxt, stat.boot_time) == (5, 0)  # "btime" without a value is skipped


@pytest.mark.parametrize(
    "text",
    [
        "cpu0 1 x 3\n",
        "cpufoo 1 2 3\n",
        "cpu-5 1 2 3\n",  # would be a negative index (a panic in procfs)
        "cpu99999999 1 2\n",
        "intr 5 1 2 x\n",
        "btime -1\n",
        "softirq 10 1 2 3\n",
        "ctxt " + "1" * 70000 + "\n",  # longer than bufio.Scanner's 64 KiB
    ],
)
def test_parse_stat_refuses(text: str) -> None:
    with pytest.raises(ParseError):
        parse_stat(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", []),
        ("\n", []),
        ("3,7\n", [3, 7]),
        ("1-3,9\n", [1, 2, 3, 9]),
        ("5-3\n", []),
        ("65537\n", [1]),  # procfs keeps 16 bits
    ],
)
def test_parse_isolated(text: str, want: list[int]) -> None:
    assert parse_isolated(text) == want


@pytest.mark.parametrize("text", ["1-2-3\n", "a\n", "1-\n", "-1\n", " 1\n"])
def test_parse_isolated_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_isolated(text)


def test_parse_schedstat_is_lenient() -> None:
    text = (
        "version 15\ntimestamp 1\n"
        "cpu0 0 0 1 2 3 4 2000000000 500000000 77\n"
        "domain0 03 1 2 3\n"
        "cpu1 0 0 1 2 3 4 18446744073709551616 1 1\n"  # does not fit 64 bits: skipped
        "cpu2 0 0 1 2\n"  # too short: not a cpu line
        "cpu3  0 0 1 2 3 4 5 6 7\n"  # two spaces: not a cpu line either
        "cpu4 0 0 1 2 3 4 5 6 7 8 9\n"
    )
    got = [(c.cpu, c.running_ns, c.waiting_ns, c.timeslices) for c in parse_schedstat(text)]
    assert got == [("0", 2000000000, 500000000, 77), ("4", 5, 6, 7)]


def test_parse_psi() -> None:
    lines = parse_psi(
        "some avg10=1.50 avg60=0.00 avg300=0.25 total=42\nnew avg10=1\nfull avg10=0 avg60=0 avg300=0 total=7\n"
    )
    assert (lines["some"].avg10, lines["some"].total_us, lines["full"].total_us) == (1.5, 42, 7)
    with pytest.raises(ParseError):
        parse_psi("some avg10=1.50 avg60=0.00 total=42\n")


# --- the cpu collector's state ---------------------------------------------------------------------------------------


def _seconds(out: list[Family], cpu: str, mode: str) -> float:
    fam = next(f for f in out if f.name == "node_cpu_seconds_total")
    return dict(fam.samples)[(("cpu", cpu), ("mode", mode))]


def test_cpu_counters_never_step_back(tmp_path: Path) -> None:
    impl, root = CpuCollector(), tmp_path
    write(root, "proc/stat", STAT)
    out: list[Family] = []
    impl.collect(context(root), out)
    assert _seconds(out, "0", "user") == 0.2
    write(root, "proc/stat", STAT.replace("cpu0 20 0 10 500", "cpu0 19 0 12 499"))  # small steps back
    out = []
    impl.collect(context(root), out)
    assert (_seconds(out, "0", "user"), _seconds(out, "0", "system"), _seconds(out, "0", "idle")) == (0.2, 0.12, 5.0)
    write(root, "proc/stat", STAT.replace("cpu0 20 0 10 500", "cpu0 1 0 1 100"))  # idle -4 s: a hotplug, start over
    out = []
    impl.collect(context(root), out)
    assert (_seconds(out, "0", "user"), _seconds(out, "0", "idle")) == (0.01, 1.0)


def test_cpu_state_matches_node_exporter_across_scrapes(tmp_path: Path, node_exporter_binary: str) -> None:
    root = tmp_path
    (root / "sys").mkdir()
    steps = [
        STAT,
        STAT.replace("cpu0 20 0 10 500", "cpu0 19 0 12 499"),
        STAT.replace("cpu1 20 0 10 500", "cpu1 1 0 1 100"),
    ]
    steps.append(STAT.replace("cpu1 20", "cpu1 20 0 10 500 3 0 0 0 0 0\ncpu2 20"))  # a CPU more: start over
    write(root, "proc/stat", steps[0])
    options = options_for(root)
    impl = CpuCollector()
    with node_exporter(flags_for(root, options, ["cpu"])) as url:
        for text in steps:
            write(root, "proc/stat", text)
            their = "\n".join(line for line in scrape(url).splitlines() if "node_scrape_collector" not in line)
            out: list[Family] = []
            impl.collect(context(root), out)
            diffs = compare(their + "\n", render(merge(out)).decode())
            assert not diffs, "\n".join(diffs)


# --- against node_exporter -------------------------------------------------------------------------------------------


def test_gpunode_serves_every_family(node_exporter_binary: str) -> None:
    text = against_node_exporter(GPUNODE)
    for collector in GROUP:
        assert succeeded(text, collector)
    for family in (
        "node_cpu_seconds_total",
        "node_cpu_guest_seconds_total",
        "node_cpu_isolated",
        "node_cpu_core_throttles_total",
        "node_cpu_package_throttles_total",
        "node_cpu_frequency_hertz",
        "node_cpu_frequency_min_hertz",
        "node_cpu_frequency_max_hertz",
        "node_cpu_scaling_frequency_hertz",
        "node_cpu_scaling_frequency_min_hertz",
        "node_cpu_scaling_frequency_max_hertz",
        "node_boot_time_seconds",
        "node_context_switches_total",
        "node_forks_total",
        "node_intr_total",
        "node_procs_running",
        "node_procs_blocked",
        "node_schedstat_running_seconds_total",
        "node_schedstat_waiting_seconds_total",
        "node_schedstat_timeslices_total",
        "node_pressure_cpu_waiting_seconds_total",
        "node_pressure_io_waiting_seconds_total",
        "node_pressure_io_stalled_seconds_total",
        "node_pressure_memory_waiting_seconds_total",
        "node_pressure_memory_stalled_seconds_total",
    ):
        assert f"\n{family}" in text, family


# Each variant edits the gpunode copy: (file, text to replace, replacement) or (file, None, whole new text / None
# to delete). The expected success values are node_exporter's; the test also checks we agree with it exactly.
VARIANTS: dict[str, tuple[list[tuple[str, str | None, str | None]], set[str]]] = {
    "short cpu lines (old kernel)": ([("proc/stat", " 0 0 0\ncpu0", "\ncpu0")], set()),
    "cpu value not a number": ([("proc/stat", "cpu1 6001452", "cpu1 6001x52")], {"cpu", "stat"}),
    "float and trailing junk in cpu line": ([("proc/stat", "cpu2 5996928", "cpu2 5996928.5")], set()),
    "softirq truncated": ([("proc/stat", " 211775 240883917", "")], {"cpu", "stat"}),
    "softirq longer": ([("proc/stat", " 240883917\n", " 240883917 12 13\n")], set()),
    "offline cpu5": ([("proc/stat", "cpu5 ", "nope5 ")], set()),
    "bad numbered irq": ([("proc/stat", "intr 2294961248 41", "intr 2294961248 4z1")], {"cpu", "stat"}),
    "no btime": ([("proc/stat", "btime 1733390112\n", "")], set()),
    "no proc/stat": ([("proc/stat", None, None)], {"cpu", "stat"}),
    "cpu-1 line": ([("proc/stat", "cpu  ", "cpu-1 ")], set()),
    "unknown cpu key": ([("proc/stat", "ctxt", "cpux 1\nctxt")], {"cpu", "stat"}),
    "isolated empty": ([(f"{CPU_DIR}/isolated", None, "\n")], set()),
    "isolated ranges": ([(f"{CPU_DIR}/isolated", None, "0-2,6\n")], set()),
    "no isolated file": ([(f"{CPU_DIR}/isolated", None, None)], set()),
    "topology and throttle holes": (
        [
            (f"{CPU_DIR}/cpu0/topology/core_id", None, None),
            (f"{CPU_DIR}/cpu1/thermal_throttle/core_throttle_count", None, "n/a\n"),
            (f"{CPU_DIR}/cpu5/thermal_throttle/core_throttle_count", None, "99\n"),
            (f"{CPU_DIR}/cpu2/thermal_throttle/package_throttle_count", None, None),
            (f"{CPU_DIR}/cpu6/thermal_throttle/package_throttle_count", None, " 5 \n"),
            (f"{CPU_DIR}/cpu3/topology/physical_package_id", None, "x\n"),
        ],
        set(),
    ),
    "no thermal_throttle at all (AMD)": (
        [
            (f"{CPU_DIR}/cpu{n}/thermal_throttle/{f}_throttle_count", None, None)
            for n in range(8)
            for f in ("core", "package")
        ],
        set(),
    ),
    "cpu without cpufreq": ([(f"{CPU_DIR}/cpu4/cpufreq", None, None)], set()),
    "dangling cpufreq link": ([(f"{CPU_DIR}/cpufreq/policy6", "rmtree", None)], set()),
    "no cpuinfo_cur_freq (intel_pstate)": (
        [(f"{CPU_DIR}/cpufreq/policy{n}/cpuinfo_cur_freq", None, None) for n in range(8)],
        set(),
    ),
    "cpufreq value unknown": ([(f"{CPU_DIR}/cpufreq/policy2/scaling_cur_freq", None, "<unknown>\n")], {"cpufreq"}),
    "transition latency garbage": (
        [(f"{CPU_DIR}/cpufreq/policy0/cpuinfo_transition_latency", None, "-1\n")],
        {"cpufreq"},
    ),
    "no scaling_driver": ([(f"{CPU_DIR}/cpufreq/policy1/scaling_driver", None, None)], {"cpufreq"}),
    "no schedstat": ([("proc/schedstat", None, None)], {"schedstat"}),
    "schedstat junk": (
        [("proc/schedstat", "version 15\n", "version 15\ncpu9 1 2 3\ncpu8 0 0 0 0 0 0 99999999999999999999 1 1\n")],
        set(),
    ),
    "schedstat line too long": ([("proc/schedstat", "timestamp", "x" * 70000 + "\ntimestamp")], set()),
    "no pressure dir": ([("proc/pressure", "rmtree", None)], {"pressure"}),
    "no io pressure": ([("proc/pressure/io", None, None)], {"pressure"}),
    "no memory pressure": ([("proc/pressure/memory", None, None)], {"pressure"}),
    "cpu pressure some only (pre-5.13)": (
        [("proc/pressure/cpu", "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", "")],
        set(),
    ),
    "pressure with unknown lines": ([("proc/pressure/io", "some", "peak avg10=x\nsome")], set()),
    "malformed io pressure": ([("proc/pressure/io", "avg60=0.52", "avg60=.")], {"pressure"}),
    "pressure line too long": (
        [("proc/pressure/memory", "total=4377102\n", "total=4377102\n" + "x" * 70000 + "\nsome avg10=?\n")],
        set(),
    ),
    "pressure total with junk": ([("proc/pressure/memory", "total=4377102", "total=4377102ms")], set()),
}


def apply(root: Path, edits: list[tuple[str, str | None, str | None]]) -> None:
    for rel, old, new in edits:
        path = root / rel
        if old == "rmtree":
            shutil.rmtree(path)
        elif old is None and new is None:
            path.unlink()
        elif old is None:
            write(root, rel, new or "")
        else:
            text = path.read_text()
            assert old in text, (rel, old)
            write(root, rel, text.replace(old, new or "", 1))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_matches_node_exporter(tmp_path: Path, node_exporter_binary: str, name: str) -> None:
    edits, failing = VARIANTS[name]
    root = gpunode_copy(tmp_path)
    apply(root, edits)
    text = against_node_exporter(root)
    assert {c for c in GROUP if not succeeded(text, c)} == failing


def test_empty_host_matches_node_exporter(tmp_path: Path, node_exporter_binary: str) -> None:
    text = against_node_exporter(tmp_path)
    assert {c for c in GROUP if not succeeded(text, c)} == {"cpu", "stat", "schedstat", "pressure"}


# --- what node_exporter cannot be asked (it crashes or will not start): we fail the collector and carry on ----------


@pytest.mark.parametrize(
    ("collector", "rel", "text"),
    [
        ("pressure", "proc/pressure/io", "some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"),  # no full: Go nil deref
        ("pressure", "proc/pressure/cpu", "full avg10=0.00 avg60=0.00 avg300=0.00 total=1\n"),
        ("cpu", "proc/stat", "cpu-3 1 2 3\n"),  # a negative index: Go index panic
        ("cpu", f"{CPU_DIR}/isolated", "1-2-3\n"),  # node_exporter refuses to start
    ],
)
def test_inputs_that_crash_node_exporter_fail_only_the_collector(
    tmp_path: Path, collector: str, rel: str, text: str
) -> None:
    root = gpunode_copy(tmp_path)
    write(root, rel, text)
    with pytest.raises(ValueError):
        TABLE[collector]().collect(context(root), [])


def test_missing_sources_are_no_data(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    for collector in ("schedstat", "pressure"):
        with pytest.raises(NoData):
            TABLE[collector]().collect(context(tmp_path), [])
    out: list[Family] = []
    TABLE["cpufreq"]().collect(context(tmp_path), out)  # no CPUs in sysfs: success, nothing served
    assert not any(f.samples for f in out)


def test_psi_seconds_use_node_exporters_rounding(tmp_path: Path) -> None:
    write(tmp_path, "proc/pressure/cpu", "some avg10=0 avg60=0 avg300=0 total=1234567890\n")
    write(
        tmp_path, "proc/pressure/io", "some avg10=0 avg60=0 avg300=0 total=0\nfull avg10=0 avg60=0 avg300=0 total=0\n"
    )
    out: list[Family] = []
    with pytest.raises(NoData):  # memory is missing
        TABLE["pressure"]().collect(context(tmp_path), out)
    value = out[0].samples[0][1]
    assert value == 1234567890 / 1000.0 / 1000.0 and value != 1234567890 / 1e6
    assert not math.isnan(value)
