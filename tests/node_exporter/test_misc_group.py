"""meminfo, vmstat, filefd, entropy, uname, time, os and textfile: parsers by table, bad input tried, and the
textfile collector's edge cases both on their own and against node_exporter (skipped where it is not installed)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest

from nvdaemon.collectors.base import HostRoots, NotPresent, ParseError
from nvdaemon.compat.node_exporter import TABLE, clock, entropy, filefd, meminfo, osrelease, textfile, uname, vmstat
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family
from tests.node_exporter.exposition import parse
from tests.node_exporter.oracle import binary, collect_once, compare, options_for, ours, theirs


def _host(root: Path, files: Mapping[str, str | bytes | None]) -> Path:
    """A host root with ``files`` (None: a directory); proc and sys always exist."""
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "sys").mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = root / rel
        if data is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return root


def _ctx(root: Path, **options: object) -> NodeContext:
    return NodeContext(HostRoots.under(root), options_for(root, **options))


def _run(fn: object, ctx: NodeContext) -> dict[str, Family]:
    out: list[Family] = []
    fn(ctx, out)  # type: ignore[operator]
    return {f.name: f for f in out}


def _value(fam: Family, **labels: str) -> float:
    for got, value in fam.samples:
        if dict(got) == labels:
            return value
    raise KeyError(labels)


# --- meminfo ---


def test_meminfo_names_units_and_types() -> None:
    text = "MemTotal:  16 kB\nActive(anon):  2 kB\nHugePages_Total:  4\n\nX_total:  3\nMemTotal:  32 kB\n"
    assert meminfo.parse_meminfo(text) == {
        "MemTotal_bytes": 32768.0,  # a repeated field: the last wins
        "Active_anon_bytes": 2048.0,
        "HugePages_Total": 4.0,
        "X_total": 3.0,
    }


def test_meminfo_families(tmp_path: Path) -> None:
    fams = _run(meminfo.collect, _ctx(_host(tmp_path, {"proc/meminfo": "Foo_total: 3\nBar(x): 1 kB\n"})))
    assert fams["node_memory_Foo_total"].type == "counter"
    assert fams["node_memory_Bar_x_bytes"].type == "gauge"
    assert fams["node_memory_Bar_x_bytes"].help == "Memory information field Bar_x_bytes."


@pytest.mark.parametrize("text", ["MemTotal:\n", "MemTotal: x kB\n", "MemTotal: 1 kB extra\n", "Bad-Name: 1\n"])
def test_meminfo_malformed_fails_with_nothing(tmp_path: Path, text: str) -> None:
    out: list[Family] = []
    with pytest.raises(ParseError):
        meminfo.collect(_ctx(_host(tmp_path, {"proc/meminfo": "MemFree: 1 kB\n" + text})), out)
    assert out == []


def test_meminfo_missing_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NotPresent):
        meminfo.collect(_ctx(_host(tmp_path, {})), [])


# --- vmstat ---


def test_vmstat_filter_and_help(tmp_path: Path) -> None:
    text = "nr_free_pages 5\npgfault 10\npgmajfault 2\npgpgin 7\npswpout 0\noom_kill 1\npgsteal_direct 9\n"
    fams = _run(vmstat.collect, _ctx(_host(tmp_path, {"proc/vmstat": text})))
    assert sorted(fams) == [f"node_vmstat_{n}" for n in ("oom_kill", "pgfault", "pgmajfault", "pgpgin", "pswpout")]
    assert fams["node_vmstat_pgfault"].type == "untyped"
    assert fams["node_vmstat_pgfault"].help == "/proc/vmstat information field pgfault."


@pytest.mark.parametrize("bad", ["oom_kill x\n", "pgfault\n", "\n"])
def test_vmstat_bad_line_keeps_what_came_before(tmp_path: Path, bad: str) -> None:
    out: list[Family] = []
    with pytest.raises(ParseError):
        vmstat.collect(_ctx(_host(tmp_path, {"proc/vmstat": "pgpgin 5\n" + bad + "pgpgout 6\n"})), out)
    assert [f.name for f in out] == ["node_vmstat_pgpgin"]


# --- filefd ---


def test_filefd_values(tmp_path: Path) -> None:
    fams = _run(filefd.collect, _ctx(_host(tmp_path, {"proc/sys/fs/file-nr": "1024\t0\t9223372036854775807\n"})))
    assert _value(fams["node_filefd_allocated"]) == 1024.0
    assert _value(fams["node_filefd_maximum"]) == 9223372036854775807.0


@pytest.mark.parametrize("text", ["1 0 100\n", "1\t0\n", "", "1\t0\tabc\n"])
def test_filefd_malformed(tmp_path: Path, text: str) -> None:
    with pytest.raises(ParseError):
        filefd.collect(_ctx(_host(tmp_path, {"proc/sys/fs/file-nr": text})), [])


# --- entropy ---

_RANDOM = "proc/sys/kernel/random/"


def test_entropy_values(tmp_path: Path) -> None:
    ctx = _ctx(_host(tmp_path, {_RANDOM + "entropy_avail": "256\n", _RANDOM + "poolsize": "256\n"}))
    fams = _run(entropy.collect, ctx)
    assert _value(fams["node_entropy_available_bits"]) == 256.0
    assert _value(fams["node_entropy_pool_size_bits"]) == 256.0


def test_entropy_failures(tmp_path: Path) -> None:
    with pytest.raises(ParseError):  # no directory at all: a failure in node_exporter too
        entropy.collect(_ctx(_host(tmp_path / "a", {})), [])
    out: list[Family] = []
    with pytest.raises(ParseError):  # no poolsize: the available bits are still out
        entropy.collect(_ctx(_host(tmp_path / "b", {_RANDOM + "entropy_avail": "9\n"})), out)
    assert [f.name for f in out] == ["node_entropy_available_bits"]
    bad = {_RANDOM + "entropy_avail": "9\n", _RANDOM + "poolsize": "9\n", _RANDOM + "write_wakeup_threshold": "-1\n"}
    with pytest.raises(ParseError):  # any known file that is not an unsigned integer
        entropy.collect(_ctx(_host(tmp_path / "c", bad)), [])


# --- uname ---


def test_uname_is_this_machine() -> None:
    got = uname.read_uname()
    u = os.uname()
    assert (got["sysname"], got["nodename"], got["release"], got["version"], got["machine"]) == tuple(u)
    with open("/proc/sys/kernel/domainname") as f:
        assert got["domainname"] == f.read().rstrip("\n")


# --- time ---

_CS = "sys/devices/system/clocksource/"


def test_clocksources_labelled_by_position(tmp_path: Path) -> None:
    files: dict[str, str | bytes | None] = {}
    for n in (0, 2, 10):
        files[f"{_CS}clocksource{n}/available_clocksource"] = f"tsc hpet{n} \n"
        files[f"{_CS}clocksource{n}/current_clocksource"] = f"cs{n}\n"
    fams = _run(clock.collect, _ctx(_host(tmp_path, files)))
    # glob order: clocksource0, clocksource10, clocksource2 -> devices 0, 1, 2
    current = {
        dict(labels)["device"]: dict(labels)["clocksource"]
        for labels, _ in fams["node_time_clocksource_current_info"].samples
    }
    assert current == {"0": "cs0", "1": "cs10", "2": "cs2"}
    assert len(fams["node_time_clocksource_available_info"].samples) == 6
    assert fams["node_time_zone_offset_seconds"].samples[0][0][0][0] == "time_zone"


def test_clocksource_missing_file_fails_after_time(tmp_path: Path) -> None:
    out: list[Family] = []
    with pytest.raises(NotPresent):
        clock.collect(_ctx(_host(tmp_path, {_CS + "clocksource0/available_clocksource": "tsc\n"})), out)
    assert [f.name for f in out] == ["node_time_seconds", "node_time_zone_offset_seconds"]
    fams = _run(clock.collect, _ctx(_host(tmp_path / "none", {})))  # no clocksource directory: success
    assert not fams["node_time_clocksource_current_info"].samples


# --- os ---


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b'NAME="Ubuntu"\nVERSION_ID="22.04"\n', {"NAME": "Ubuntu", "VERSION_ID": "22.04"}),
        (b"export NAME='My OS' # comment\n", {"NAME": "My OS"}),
        (b'A=x y  # c\nB=\nC=""\n  # only a comment\n\n', {"A": "x y"}),
        (b'ID="a\\u00e9\\"b\\n"\n', {"ID": 'a\u00e9"b\n'}),
        (b"ID=\"x\"y'z'\r\n", {"ID": "xyz"}),
        (b'ID="\\ud83d\\ude00"\n', {"ID": "\U0001f600"}),
    ],
)
def test_os_release_parse(text: bytes, expected: dict[str, str]) -> None:
    assert osrelease.parse_os_release(text) == expected


@pytest.mark.parametrize(
    "text", [b'NAME="open\n', b"NAME='open\n", b"NOEQUALS\n", b"=x\n", b"1A=x\n", b"A-B=x\n", b'A="\\q"\n', b"A=\x01\n"]
)
def test_os_release_parse_errors(text: bytes) -> None:
    with pytest.raises(ParseError):
        osrelease.parse_os_release(text)


@pytest.mark.parametrize(("version_id", "expected"), [("22.04", 22.04), ("9", 9.0), ("v1", 0.0), ("1.2.3", 1.2)])
def test_os_version(version_id: str, expected: float) -> None:
    assert osrelease.major_minor(version_id) == expected


def test_os_lookup_order_and_absence(tmp_path: Path) -> None:
    both = {"etc/os-release": "ID=etc\n", "usr/lib/os-release": "ID=usr\nVERSION_ID=9.3\n"}
    fams = _run(osrelease.make().collect, _ctx(_host(tmp_path / "a", both)))
    assert dict(fams["node_os_info"].samples[0][0])["id"] == "etc"
    assert "node_os_version" not in fams  # no VERSION_ID in the file that was read
    fams = _run(
        osrelease.make().collect, _ctx(_host(tmp_path / "b", {"usr/lib/os-release": both["usr/lib/os-release"]}))
    )
    assert _value(fams["node_os_version"], id="usr", id_like="", name="") == 9.3
    with pytest.raises(NotPresent):
        osrelease.make().collect(_ctx(_host(tmp_path / "c", {})), [])


def test_os_parse_error_then_empty_labels_until_the_file_changes(tmp_path: Path) -> None:
    root = _host(tmp_path, {"etc/os-release": 'NAME="unclosed\n'})
    impl = osrelease.make()
    with pytest.raises(ParseError):  # the first scrape fails, as node_exporter's does
        impl.collect(_ctx(root), [])
    fams = _run(impl.collect, _ctx(root))  # then node_exporter serves its cached, empty release
    assert all(v == "" for _, v in fams["node_os_info"].samples[0][0])
    path = root / "etc" / "os-release"
    path.write_text("NAME=Fixed\nVERSION_ID=2\n")
    os.utime(path, ns=(0, 10**18))
    fams = _run(impl.collect, _ctx(root))
    assert _value(fams["node_os_version"], id="", id_like="", name="Fixed") == 2.0


# --- textfile ---

_TF = "var/lib/node_exporter/textfile_collector/"


def _textfile(root: Path) -> dict[str, Family]:
    return _run(TABLE["textfile"]().collect, _ctx(root))


def _scrape_error(fams: dict[str, Family]) -> float:
    return _value(fams["node_textfile_scrape_error"])


def test_textfile_good_file(tmp_path: Path) -> None:
    text = '# HELP a_total Things.\n# TYPE a_total counter\na_total{k="v"} 3\nb{x="1"} 1\nb{y="2"} 2\n'
    root = _host(tmp_path, {_TF + "x.prom": text, _TF + "notes.txt": "ignored"})
    fams = _textfile(root)
    assert fams["a_total"].type == "counter"
    assert fams["a_total"].help == "Things."
    path = str(root / _TF / "x.prom")
    assert fams["b"].help == f"Metric read from {path}"  # node_exporter's generated help
    assert sorted(labels for labels, _ in fams["b"].samples) == [(("x", ""), ("y", "2")), (("x", "1"), ("y", ""))]
    assert _value(fams["node_textfile_mtime_seconds"], file=path) == float(int(os.stat(path).st_mtime))
    assert _scrape_error(fams) == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        "a 1",  # no final newline
        "a 1 \n",  # a blank after the value is read as an empty timestamp
        "a 1 1700000000000\n",  # timestamps are refused
        "a 1\r\n",
        'a{x="1} 1\n',
        "# TYPE a gauge\n# TYPE a gauge\na 1\n",
        "a 1\n# TYPE a gauge\n",
        "# HELP a bad\\t escape\na 1\n",
        "# TYPE a gaugehistogram\na 1\n",
        'a{__name__="x"} 1\n',
        'a{x="1",x="2"} 1\n',
        b'a{x="\xff"} 1\n',
        "a 1_0\n",
    ],
)
def test_textfile_malformed_file_is_skipped(tmp_path: Path, bad: str | bytes) -> None:
    root = _host(tmp_path, {_TF + "bad.prom": bad, _TF + "good.prom": "g 1\n"})
    fams = _textfile(root)
    assert _scrape_error(fams) == 1.0
    assert "a" not in fams and _value(fams["g"]) == 1.0
    assert [dict(labels)["file"] for labels, _ in fams["node_textfile_mtime_seconds"].samples] == [
        str(root / _TF / "good.prom")
    ]


def test_textfile_empty_missing_and_unset_directory(tmp_path: Path) -> None:
    fams = _textfile(_host(tmp_path / "empty", {_TF: None}))
    assert sorted(fams) == ["node_textfile_scrape_error"] and _scrape_error(fams) == 0.0
    fams = _textfile(_host(tmp_path / "missing", {}))
    assert sorted(fams) == ["node_textfile_scrape_error"] and _scrape_error(fams) == 1.0
    out: list[Family] = []
    textfile.collect(_ctx(_host(tmp_path / "unset", {}), textfileDirectory=""), out)
    assert [(f.name, f.samples) for f in out] == [("node_textfile_scrape_error", [((), 0.0)])]


def test_textfile_duplicate_series_keeps_the_first(tmp_path: Path) -> None:
    root = _host(tmp_path, {_TF + "a.prom": 'd{k="1"} 1\nd{k="1"} 2\n', _TF + "b.prom": 'd{k="1"} 3\n'})
    options = options_for(root)
    text = collect_once(HostRoots.under(root), options, TABLE, ["textfile"]).decode()
    assert parse(text)["d"].samples == {(("k", "1"),): 1.0}  # the parser refuses a duplicate series


def test_textfile_same_family_in_two_files(tmp_path: Path) -> None:
    joined = _host(tmp_path / "j", {_TF + "a.prom": 'x{f="a"} 1\n', _TF + "b.prom": 'x{f="b"} 2\n'})
    fams = _textfile(joined)
    assert len(fams["x"].samples) == 2
    assert fams["x"].help == f"Metric read from {joined / _TF / 'a.prom'}, {joined / _TF / 'b.prom'}"
    files = {_TF + "a.prom": '# HELP x one\nx{f="a"} 1\n', _TF + "b.prom": '# HELP x two\nx{f="b"} 2\n'}
    fams = _textfile(_host(tmp_path / "c", files))
    assert fams["x"].samples == [((("f", "a"),), 1.0)]  # the registry refuses the copy with another HELP


def test_textfile_summary_and_histogram_keep_their_type(tmp_path: Path) -> None:
    text = (
        '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 10\ns_count 4\n'
        '# TYPE h histogram\nh_bucket{le="0.1"} 1\nh_bucket{le="1"} 3\nh_sum 2.5\nh_count 4\n'
    )
    root = _host(tmp_path, {_TF + "x.prom": text})
    rendered = collect_once(HostRoots.under(root), options_for(root), TABLE, ["textfile"]).decode()
    fams = parse(rendered)
    assert (fams["s"].type, fams["h"].type) == ("summary", "histogram")
    assert fams["s"].samples == {
        (("quantile", "0.5"),): 1.0,
        (("__name__", "s_sum"),): 10.0,
        (("__name__", "s_count"),): 4.0,
    }
    assert fams["h"].samples[(("__name__", "h_bucket"), ("le", "+Inf"))] == 4.0  # added, as Go's encoder does
    assert fams["h"].samples[(("__name__", "h_bucket"), ("le", "0.1"))] == 1.0
    assert "s_sum" not in fams and "h_bucket" not in fams
    assert 'h_bucket{le="+Inf"} 4\n' in rendered


def test_textfile_collision_with_our_family(tmp_path: Path) -> None:
    root = _host(tmp_path, {"proc/loadavg": "0.5 0.4 0.3 1/100 42\n", _TF + "x.prom": "node_load1 9\nmine 1\n"})
    text = collect_once(HostRoots.under(root), options_for(root), TABLE, ["loadavg", "textfile"]).decode()
    fams = parse(text)  # would raise on a duplicated series
    assert fams["node_load1"].samples == {(): 0.5}
    assert fams["node_textfile_scrape_error"].samples == {(): 1.0}
    assert fams["mine"].samples == {(): 1.0}
    assert text.count("# TYPE node_load1 ") == 1


# --- against node_exporter itself, on tricky inputs ---

ORACLE_CASES: dict[str, tuple[str, Mapping[str, str | bytes | None]]] = {
    "textfile-summary-histogram": (
        "textfile",
        {
            _TF + "lat.prom": (
                "# HELP job_seconds Job run time.\n# TYPE job_seconds summary\n"
                'job_seconds{job="backup",quantile="0.5"} 12.5\njob_seconds{job="backup",quantile="0.99"} 40\n'
                'job_seconds_sum{job="backup"} 1234.5\njob_seconds_count{job="backup"} 97\n'
                "# TYPE req_bytes histogram\n"
                'req_bytes_bucket{le="100"} 3\nreq_bytes_bucket{le="1000"} 9\nreq_bytes_sum 4200\nreq_bytes_count 11\n'
                "# TYPE done_total counter\ndone_total 5\n"
            ),
        },
    ),
    "textfile-tricky": (
        "textfile",
        {
            _TF + "a.prom": '# HELP h x\\\\y\\nz\n# TYPE h CoUnTeR\nh 1\nn{x="q\\"\\\\\\n",} NaN\nn{x="2"} -Inf\n',
            _TF + "b.prom": 'a { x = "1" , y="2" }   7\nz{x="1"}7\n\n  \n\tw 1\n',
            _TF + "c.prom": "a 1 \n",
            _TF + "d.prom": None,  # a directory: read as an empty file
            _TF + "e.prom": "# TYPE x gauge\nx 1\n",
            _TF + "f.prom": "# TYPE x counter\nx 2\n",
        },
    ),
    "os-quirky": (
        "os",
        {"etc/os-release": b'export NAME=\'My OS\' # c\nVERSION_ID=10 # x\nID="a\\u00e9\\"b"\nPRETTY_NAME="x"y\'z\'\n'},
    ),
    "meminfo-odd": ("meminfo", {"proc/meminfo": "MemTotal: 10 kB\nFoo(bar): 5\nX_total: 7\nY: 0x1p4\n\n"}),
    "vmstat-bad": ("vmstat", {"proc/vmstat": "pgfault 10\noom_kill x\npgpgin 5\n"}),
}


@pytest.mark.skipif(binary() is None, reason="prometheus-node-exporter is not installed")
@pytest.mark.parametrize("case", sorted(ORACLE_CASES))
def test_matches_node_exporter_on_tricky_input(tmp_path: Path, case: str) -> None:
    collector, files = ORACLE_CASES[case]
    root = _host(tmp_path, files)
    options = options_for(root)
    diffs = compare(theirs(root, options, [collector]), ours(root, options, [collector]))
    assert not diffs, "\n".join(diffs)
