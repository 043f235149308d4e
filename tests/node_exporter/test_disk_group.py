"""diskstats, mdadm, nvme and filesystem: parser tables, bad input, the stuck-mount state, and node_exporter itself
on host roots built in ``tmp_path`` (each variant: same series, same ``node_scrape_collector_success``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from nvdaemon.collectors.base import HostRoots
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.context import NoData, NodeContext
from nvdaemon.compat.node_exporter.diskstats import parse_diskstats, parse_udev
from nvdaemon.compat.node_exporter.family import Family
from nvdaemon.compat.node_exporter.filesystem import FilesystemCollector, MountsError, parse_mounts
from nvdaemon.compat.node_exporter.mdadm import MdstatError, parse_mdstat
from nvdaemon.config import NodeExporterConfig
from tests.node_exporter.conftest import HOSTS
from tests.node_exporter.oracle import compare, options_for, ours, theirs

COUNTERS_17 = " ".join(str(n) for n in range(1, 18))


def host(tmp_path: Path, files: dict[str, str]) -> Path:
    """A host root with ``files`` (path -> text) and empty proc/ and sys/ (node_exporter wants both)."""
    for sub in ("proc", "sys"):
        (tmp_path / sub).mkdir(exist_ok=True)
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def against_node_exporter(root: Path, collector: str, **overrides: Any) -> str:
    """Assert that we match node_exporter on ``root``; return node_exporter's text."""
    options = options_for(root, **overrides)
    their_text = theirs(root, options, [collector])
    diffs = compare(their_text, ours(root, options, [collector]))
    assert not diffs, "\n".join(diffs)
    return their_text


def success(text: str, collector: str) -> bool:
    return f'node_scrape_collector_success{{collector="{collector}"}} 1' in text


def run(collector: str, root: Path, impl: Any = None, **overrides: Any) -> tuple[dict[str, Family], Exception | None]:
    """Our collector on ``root``: its families by name and the exception it raised (None on success)."""
    ctx = NodeContext(HostRoots.under(root), msgspec.convert({"enabled": True, **overrides}, NodeExporterConfig))
    out: list[Family] = []
    try:
        (impl or TABLE[collector]()).collect(ctx, out)
    except Exception as exc:
        return {f.name: f for f in out}, exc
    return {f.name: f for f in out}, None


def series(fam: Family) -> dict[tuple[tuple[str, str], ...], float]:
    return dict(fam.samples)


# --------------------------------------------------------------------------------------------------- diskstats


@pytest.mark.parametrize(
    ("line", "count"),
    [
        ("8 0 sda 1 2 3 4 5 6 7 8 9 10 11", 11),  # kernel < 4.18
        ("8 0 sda 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15", 15),  # 4.18+: discards
        (f"8 0 sda {COUNTERS_17}", 17),  # 5.5+: flushes
        (f"8 0 sda {COUNTERS_17} 18 19", 17),  # a future kernel's extra columns are ignored
    ],
)
def test_diskstats_field_counts(line: str, count: int) -> None:
    (dev,) = parse_diskstats(line + "\n")
    assert (dev.major, dev.minor, dev.name, len(dev.stats)) == (8, 0, "sda", count)
    assert dev.stats == tuple(range(1, count + 1))


def test_diskstats_short_and_blank_lines_are_skipped() -> None:
    text = "\n   \n8 0 sda 1 2 3 4 5 6 7 8 9 10\n8 16 sdb 1 2 3 4 5 6 7 8 9 10 11\n"
    assert [d.name for d in parse_diskstats(text)] == ["sdb"]


@pytest.mark.parametrize(
    "line",
    [
        "8 0 sda 1 2 x 4 5 6 7 8 9 10 11",  # not a number
        "8 0 sda 1 -2 3 4 5 6 7 8 9 10 11",  # no sign for an unsigned counter
        "8 4294967296 sda 1 2 3 4 5 6 7 8 9 10 11",  # minor past uint32
        "8 0 sda 18446744073709551616 2 3 4 5 6 7 8 9 10 11",  # past uint64
        "8 0 sda 1 2 3 4 5 x",  # a short line is still scanned up to its bad field
    ],
)
def test_diskstats_bad_numbers_fail_the_file(line: str) -> None:
    with pytest.raises(ValueError, match="diskstats: bad number"):
        parse_diskstats(f"8 16 sdb {COUNTERS_17}\n{line}\n")


def test_udev_properties() -> None:
    text = "S:disk/by-id/x\nE:ID_MODEL=A B\nE:ID_FS_LABEL=a=b\nE:NOVALUE\nL:0\nE:ID_ATA=1"
    assert parse_udev(text) == {"ID_MODEL": "A B", "ID_FS_LABEL": "a=b", "ID_ATA": "1"}


def test_diskstats_gpunode_families() -> None:
    fams, exc = run("diskstats", HOSTS / "gpunode")
    assert exc is None
    devices = {dict(labels)["device"] for labels, _ in fams["node_disk_info"].samples}
    assert devices == {"nvme0n1", "nvme1n1", "sda", "sdb", "md0", "md1", "dm-0"}  # loops, partitions excluded
    assert series(fams["node_disk_read_bytes_total"])[(("device", "sda"),)] == 184220417 * 512
    assert series(fams["node_disk_flush_requests_time_seconds_total"])[(("device", "sda"),)] == 616.423
    assert {dict(k)["device"] for k, _ in fams["node_disk_ata_rotation_rate_rpm"].samples} == {"sda", "sdb"}
    assert [dict(k)["vg_name"] for k, _ in fams["node_disk_device_mapper_info"].samples] == ["vg0"]


def test_diskstats_device_include_replaces_exclude() -> None:
    fams, _ = run("diskstats", HOSTS / "gpunode", diskstats={"deviceInclude": "^(sda|loop0)$"})
    assert sorted(dict(k)["device"] for k, _ in fams["node_disk_info"].samples) == ["loop0", "sda"]


def test_diskstats_missing_file_fails(tmp_path: Path) -> None:
    _, exc = run("diskstats", host(tmp_path, {}))
    assert isinstance(exc, NoData)


@pytest.mark.usefixtures("node_exporter_binary")
def test_diskstats_variants_match_node_exporter(tmp_path: Path) -> None:
    lines = [
        "   8       0 sda 1 2 3 4 5 6 7 8 9 10 11",
        "   8      16 sdb 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
        f" 259       0 nvme0n1 {COUNTERS_17}",
        "   7       0 loop0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15",
        "   8      32 sdc 1 2 3",
    ]
    udev = {
        # ATA disk with one value node_exporter cannot parse and one property missing.
        "run/udev/data/b8:0": "E:ID_ATA=1\nE:ID_ATA_WRITE_CACHE=1\nE:ID_ATA_ROTATION_RATE_RPM=fast\n",
        "run/udev/data/b8:16": "E:ID_ATA=\nE:ID_ATA_WRITE_CACHE=1\nE:ID_FS_TYPE=ext4\n",  # ID_ATA empty: no ATA
    }
    root = host(tmp_path, {"proc/diskstats": "\n".join(lines) + "\n", **udev})
    assert success(against_node_exporter(root, "diskstats"), "diskstats")
    against_node_exporter(root, "diskstats", diskstats={"deviceExclude": "", "deviceInclude": "^(sd|loop)"})
    (root / "proc/diskstats").write_text("\n".join([*lines, "   8 48 sdd 1 2 3 4 five 6 7 8 9 10 11"]) + "\n")
    assert not success(against_node_exporter(root, "diskstats"), "diskstats")
    (root / "proc/diskstats").unlink()
    assert not success(against_node_exporter(root, "diskstats"), "diskstats")


# ------------------------------------------------------------------------------------------------------ mdadm

RAID1_CLEAN = """\
Personalities : [raid1]
md0 : active raid1 sdb1[1] sda1[0]
      1046528 blocks super 1.2 [2/2] [UU]

unused devices: <none>
"""
RAID1_RECOVERY = """\
Personalities : [raid1] [raid6] [raid5] [raid4]
md2 : active raid1 sdd1[2] sdc1[0] sde1[3](S) sdf1[4](F)
      976630464 blocks super 1.2 [2/1] [U_]
      [==>..................]  recovery = 12.6% (123456789/976630464) finish=71.1min speed=199987K/sec
      bitmap: 3/8 pages [12KB], 65536KB chunk

md3 : active raid5 sdg1[0] sdh1[1] sdi1[3]
      1953260544 blocks super 1.2 level 5, 512k chunk, algorithm 2 [3/3] [UUU]
        resync=DELAYED

md4 : active raid6 sdj1[0] sdk1[1] sdl1[2] sdm1[3]
      1953260544 blocks super 1.2 level 6, 512k chunk, algorithm 2 [4/4] [UUUU]
      [>....................]  resync =  0.4% (4194304/976630272) finish=97.2min speed=166666K/sec

md5 : inactive sdn1[0](S)
      976630464 blocks super 1.2

md6 : active raid0 sdo1[1] sdp1[0]
      1953260544 blocks super 1.2 512k chunks

unused devices: <none>
"""


def test_mdstat_clean_raid1() -> None:
    (md,) = parse_mdstat(RAID1_CLEAN)
    assert (md.name, md.state, md.disks_active, md.disks_total, md.blocks, md.blocks_synced) == (
        "md0",
        "active",
        2,
        2,
        1046528,
        1046528,
    )


def test_mdstat_states_and_disks() -> None:
    arrays = {md.name: md for md in parse_mdstat(RAID1_RECOVERY)}
    md2 = arrays["md2"]
    assert (md2.state, md2.disks_active, md2.disks_total, md2.disks_failed, md2.disks_spare) == (
        "recovering",
        1,
        2,
        1,
        1,
    )
    assert md2.blocks_synced == 123456789  # the line after the bitmap line is the progress line
    assert (arrays["md3"].state, arrays["md3"].blocks_synced) == ("resyncing", 0)  # DELAYED: nothing synced
    assert (arrays["md4"].state, arrays["md4"].blocks_synced) == ("resyncing", 4194304)
    assert (arrays["md5"].state, arrays["md5"].disks_total, arrays["md5"].disks_spare) == ("inactive", 0, 1)
    assert (arrays["md6"].disks_active, arrays["md6"].disks_total) == (2, 2)  # raid0: members counted


@pytest.mark.parametrize(
    "text",
    [
        "md0 : active\n",  # too few lines after the array line
        "md0 :\n      1 blocks [2/2] [UU]\n\n\n",  # too few fields on the array line
        "md0 : active raid1 sda1[0]\n      many blocks [2/2] [UU]\n\n\n",  # size not a number
        "md0 : active raid1 sda1[0]\n      1046528 blocks super 1.2\n\n\n",  # no [n/m] [UU]
        "md0 : active raid1 sda1[0]\n      10 blocks [2/2] [UU]\n      recovery = 5% (1/10) finish=1min\n\n",
    ],
)
def test_mdstat_malformed(text: str) -> None:
    with pytest.raises(MdstatError):
        parse_mdstat(text)


@pytest.mark.usefixtures("node_exporter_binary")
@pytest.mark.parametrize(
    "text",
    [
        RAID1_CLEAN,
        RAID1_RECOVERY,
        RAID1_RECOVERY.replace("resync=DELAYED", "resync=PENDING"),
        "Personalities : \nunused devices: <none>\n",
        "md0 : active raid1 sda1[0]\n      many blocks [2/2] [UU]\n\n\n",
        RAID1_RECOVERY.replace("speed=199987K/sec", "speed=fastK/sec"),
        RAID1_CLEAN.replace("\n\nunused", "\n      [=>...]  check = 9.5% (99/1046528) finish=2.0min speed=1000K/sec\n"),
    ],
)
def test_mdadm_variants_match_node_exporter(tmp_path: Path, text: str) -> None:
    against_node_exporter(host(tmp_path, {"proc/mdstat": text}), "mdadm")


# ------------------------------------------------------------------------------------------------------- nvme

NVME = "sys/devices/pci0000:00/0000:00:01.2/0000:02:00.0/nvme/nvme0"


def nvme_files(**attrs: str) -> dict[str, str]:
    values = {"firmware_rev": "GDC5602Q\n", "model": "SAMSUNG MZQL23T8HCLS-00A07   \n", "serial": "S64H  \n"}
    values |= {"state": "resetting\n"} | attrs
    return {f"{NVME}/{name}": text for name, text in values.items() if text}


def link_nvme(root: Path) -> Path:
    (root / "sys/class/nvme").mkdir(parents=True)
    (root / "sys/class/nvme/nvme0").symlink_to("../../devices/pci0000:00/0000:00:01.2/0000:02:00.0/nvme/nvme0")
    return root


def test_nvme_trims_padding(tmp_path: Path) -> None:
    fams, exc = run("nvme", link_nvme(host(tmp_path, nvme_files())))
    assert exc is None
    ((labels, value),) = fams["node_nvme_info"].samples
    assert dict(labels) == {
        "device": "nvme0",
        "firmware_revision": "GDC5602Q",
        "model": "SAMSUNG MZQL23T8HCLS-00A07",
        "serial": "S64H",
        "state": "resetting",
    }
    assert value == 1.0


def test_nvme_missing_attribute_fails_without_series(tmp_path: Path) -> None:
    fams, exc = run("nvme", link_nvme(host(tmp_path, nvme_files(serial=""))))
    assert isinstance(exc, FileNotFoundError) and not fams


@pytest.mark.usefixtures("node_exporter_binary")
def test_nvme_variants_match_node_exporter(tmp_path: Path) -> None:
    root = host(tmp_path, nvme_files(model="M" * 200 + "\n"))  # longer than the 128 bytes read
    assert not success(against_node_exporter(root, "nvme"), "nvme")  # no /sys/class/nvme
    link_nvme(root)
    assert success(against_node_exporter(root, "nvme"), "nvme")
    (root / NVME / "state").unlink()
    assert not success(against_node_exporter(root, "nvme"), "nvme")


# ------------------------------------------------------------------------------------------------- filesystem


def test_mounts_parse_and_decode() -> None:
    text = (
        "/dev/sda1 / ext4 rw,relatime 0 0\n"
        "/dev/sdb1 /mnt/my\\040disk\\011x xfs ro 0 0\r\n"
        "/dev/sdc1 /mnt/back\\134slash ext4 rw 0 0\n"
    )
    mounts = parse_mounts(text)
    assert [m.mount_point for m in mounts] == ["/", "/mnt/my disk\tx", "/mnt/back\\134slash"]
    assert (mounts[1].fs_type, mounts[1].options) == ("xfs", "ro")


def test_mounts_rootfs_prefix_stripped() -> None:
    mounts = parse_mounts("/dev/sda1 /host ext4 rw 0 0\n/dev/sda2 /host/boot ext4 rw 0 0\n", "/host")
    assert [m.mount_point for m in mounts] == ["/", "/boot"]


@pytest.mark.parametrize("text", ["/dev/sda1 / ext4\n", "/dev/sda1 / ext4 rw 0 0\n\n/dev/sda2 /b ext4 rw 0 0\n"])
def test_mounts_malformed(text: str) -> None:
    with pytest.raises(MountsError):
        parse_mounts(text)


def stat_result(blocks: int = 1000, free: int = 600, avail: int = 500) -> SimpleNamespace:
    return SimpleNamespace(f_bsize=4096, f_blocks=blocks, f_bfree=free, f_bavail=avail, f_files=64, f_ffree=32)


MOUNTS = "/dev/sda1 / ext4 rw 0 0\nnfs:/x /mnt/nfs nfs4 ro,hard 0 0\nnfs:/x /mnt/nfs nfs4 ro,hard 0 0\n"


def test_filesystem_values_readonly_and_duplicates(tmp_path: Path) -> None:
    calls: list[str] = []

    def statfs(path: str) -> SimpleNamespace:
        calls.append(path)
        return stat_result()

    root = host(tmp_path, {"proc/1/mounts": MOUNTS})
    fams, exc = run("filesystem", root, FilesystemCollector(statfs))
    assert exc is None
    assert sorted(calls) == [str(root), str(root / "mnt/nfs")]  # the duplicate line is statfs'ed once
    nfs = (("device", "nfs:/x"), ("fstype", "nfs4"), ("mountpoint", "/mnt/nfs"))
    assert series(fams["node_filesystem_size_bytes"])[nfs] == 4096000.0
    assert series(fams["node_filesystem_avail_bytes"])[nfs] == 2048000.0
    assert series(fams["node_filesystem_files_free"])[nfs] == 32.0
    root_fs = (("device", "/dev/sda1"), ("fstype", "ext4"), ("mountpoint", "/"))
    assert series(fams["node_filesystem_readonly"]) == {root_fs: 0.0, nfs: 1.0}


def test_filesystem_failing_statfs_is_a_device_error(tmp_path: Path) -> None:
    def statfs(path: str) -> SimpleNamespace:
        if path.endswith("nfs"):
            raise OSError(116, "Stale file handle")
        return stat_result()

    fams, exc = run("filesystem", host(tmp_path, {"proc/1/mounts": MOUNTS}), FilesystemCollector(statfs))
    assert exc is None
    errors = {dict(k)["mountpoint"]: v for k, v in fams["node_filesystem_device_error"].samples}
    assert errors == {"/": 0.0, "/mnt/nfs": 1.0}
    assert {dict(k)["mountpoint"] for k, _ in fams["node_filesystem_size_bytes"].samples} == {"/"}


def test_filesystem_stuck_mount(tmp_path: Path) -> None:
    release = threading.Event()
    calls: list[str] = []

    def statfs(path: str) -> SimpleNamespace:
        calls.append(path)
        if path.endswith("nfs") and not release.is_set():
            release.wait(10)  # a hung NFS server, until the test lets it answer
        return stat_result()

    root = host(tmp_path, {"proc/1/mounts": MOUNTS})
    impl = FilesystemCollector(statfs)
    timeout = {"filesystem": {"mountTimeoutSeconds": 0.05}}

    def nfs_error() -> float:
        fams, exc = run("filesystem", root, impl, **timeout)
        assert exc is None
        return {dict(k)["mountpoint"]: v for k, v in fams["node_filesystem_device_error"].samples}["/mnt/nfs"]

    assert nfs_error() == 1.0  # timed out: stuck
    assert impl.stuck == {"/mnt/nfs"}
    assert nfs_error() == 1.0  # still stuck: not statfs'ed again
    assert calls.count(str(root / "mnt/nfs")) == 1
    release.set()
    for _ in range(200):  # the blocked call returns and unmarks the mount point
        if not impl.stuck:
            break
        threading.Event().wait(0.01)
    assert not impl.stuck
    assert nfs_error() == 0.0  # monitored again
    assert calls.count(str(root / "mnt/nfs")) == 2


def test_filesystem_stuck_mounts_share_one_deadline(tmp_path: Path) -> None:
    release = threading.Event()

    def statfs(path: str) -> SimpleNamespace:
        if "/mnt/" in path:
            release.wait(10)
        return stat_result()

    mounts = "".join(f"srv:/{n} /mnt/{n} nfs4 rw 0 0\n" for n in ("a", "b", "c")) + "/dev/sda1 / ext4 rw 0 0\n"
    impl = FilesystemCollector(statfs)
    began = time.monotonic()
    fams, exc = run(
        "filesystem", host(tmp_path, {"proc/1/mounts": mounts}), impl, filesystem={"mountTimeoutSeconds": 1.0}
    )
    took = time.monotonic() - began
    release.set()
    # One 1 s timeout for the three, not three in a row (3 s or more); the rest leaves room for a loaded machine.
    assert exc is None and took < 2.5
    errors = {dict(k)["mountpoint"]: v for k, v in fams["node_filesystem_device_error"].samples}
    assert errors == {"/mnt/a": 1.0, "/mnt/b": 1.0, "/mnt/c": 1.0, "/": 0.0}
    assert impl.stuck <= {"/mnt/a", "/mnt/b", "/mnt/c"}


def test_filesystem_gpunode_variants() -> None:
    # gpunode has no mnt/home directory on purpose: that NFS mount's statfs fails like a stale handle's would.
    fams, exc = run("filesystem", HOSTS / "gpunode")
    assert exc is None
    errors = {dict(k)["mountpoint"]: v for k, v in fams["node_filesystem_device_error"].samples}
    assert errors["/mnt/home"] == 1.0 and errors["/mnt/local scratch"] == 0.0
    assert "/proc" not in errors and "/dev/shm" not in errors and "/snap/core20/2015" not in errors  # excluded
    readonly = {dict(k)["mountpoint"]: v for k, v in fams["node_filesystem_readonly"].samples}
    assert readonly["/mnt/datasets"] == 1.0 and readonly["/"] == 0.0 and "/mnt/home" not in readonly


def test_filesystem_without_mount_table_fails(tmp_path: Path) -> None:
    _, exc = run("filesystem", host(tmp_path, {}))
    assert isinstance(exc, NoData)


@pytest.mark.usefixtures("node_exporter_binary")
def test_filesystem_variants_match_node_exporter(tmp_path: Path) -> None:
    mounts = (
        "/dev/sda1 / ext4 rw,relatime 0 0\n"
        "/dev/sdb1 /data\\040disk xfs ro,relatime 0 0\n"
        "/dev/sdb1 /data\\040disk xfs ro,relatime 0 0\n"
        "nfs:/gone /mnt/gone nfs4 rw 0 0\n"
        "proc /proc proc rw 0 0\n"
    )
    root = host(tmp_path, {"proc/mounts": mounts, "data disk/.keep": ""})
    text = against_node_exporter(root, "filesystem")  # /proc/1/mounts hidden: /proc/mounts
    assert success(text, "filesystem") and 'mountpoint="/data disk"' in text
    # An empty exclude pattern matches every mount point in node_exporter: nothing is exported.
    against_node_exporter(root, "filesystem", filesystem={"mountPointsExclude": ""})
    (root / "proc/1").mkdir()
    (root / "proc/1/mounts").write_text(mounts + "broken line\n")
    assert not success(against_node_exporter(root, "filesystem"), "filesystem")


LOCAL_MOUNTS = "/dev/sda1 / ext4 rw 0 0\n/dev/sdb1 /data xfs rw 0 0\ntmpfs /run tmpfs rw 0 0\n"


def test_filesystem_local_mounts_share_one_thread(tmp_path: Path) -> None:
    threads: dict[str, threading.Thread] = {}  # the objects, not their idents: a finished thread's is reused

    def statfs(path: str) -> SimpleNamespace:
        threads[path] = threading.current_thread()
        return stat_result()

    root = host(
        tmp_path, {"proc/1/mounts": LOCAL_MOUNTS + "srv:/a /mnt/a nfs4 rw 0 0\nsshfs /mnt/b fuse.sshfs rw 0 0\n"}
    )
    fams, exc = run("filesystem", root, FilesystemCollector(statfs), filesystem={"mountPointsExclude": "^/proc"})
    assert exc is None
    local = {threads[str(root)], threads[str(root / "data")], threads[str(root / "run")]}
    assert len(local) == 1  # the three local file systems: one thread call
    remote = {threads[str(root / "mnt/a")], threads[str(root / "mnt/b")]}
    assert len(remote) == 2 and not remote & local  # network and FUSE mounts: a thread each
    errors = {dict(k)["mountpoint"]: v for k, v in fams["node_filesystem_device_error"].samples}
    assert errors == {"/": 0.0, "/data": 0.0, "/run": 0.0, "/mnt/a": 0.0, "/mnt/b": 0.0}


def test_filesystem_stuck_local_mount_costs_only_itself(tmp_path: Path) -> None:
    release = threading.Event()
    calls: list[str] = []

    def statfs(path: str) -> SimpleNamespace:
        calls.append(path)
        if path.endswith("data") and not release.is_set():
            release.wait(10)  # a dead disk, until the test lets it answer
        return stat_result()

    root = host(tmp_path, {"proc/1/mounts": LOCAL_MOUNTS})
    impl = FilesystemCollector(statfs)

    def errors() -> dict[str, float]:
        fams, exc = run("filesystem", root, impl, filesystem={"mountTimeoutSeconds": 0.05})
        assert exc is None
        return {dict(k)["mountpoint"]: v for k, v in fams["node_filesystem_device_error"].samples}

    # The batch reaches / before the stuck /data; /run, behind it, gets a statfs of its own in the same cycle.
    assert errors() == {"/": 0.0, "/data": 1.0, "/run": 0.0}
    assert impl.stuck == {"/data"}
    assert calls.count(str(root / "run")) == 1
    assert errors() == {"/": 0.0, "/data": 1.0, "/run": 0.0}  # the next batch skips the stuck mount
    assert calls.count(str(root / "data")) == 1
    release.set()
    for _ in range(200):  # the blocked call returns, unmarks /data, and its abandoned batch goes no further
        if not impl.stuck:
            break
        threading.Event().wait(0.01)
    assert not impl.stuck
    assert calls.count(str(root / "run")) == 2  # the first cycle's own call and the second cycle's batch
    assert errors() == {"/": 0.0, "/data": 0.0, "/run": 0.0}
    assert calls.count(str(root / "data")) == 2
