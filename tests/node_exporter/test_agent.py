"""The whole surface through the running agent, against node_exporter with every collector on the same root.

Also: the surface on this machine's own /proc and /sys (families whose values do not move between two scrapes are
compared by value, every family by name, HELP, type and label sets), the reads shared with the nodevitals_hw
surface, and the surface staying off by default.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from nvdaemon.app import tier_collectors
from nvdaemon.collectors import base
from nvdaemon.collectors.base import Collector, HostRoots
from nvdaemon.collectors.heldfiles import HeldFiles
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.options import DEFAULTS
from nvdaemon.compat.node_exporter.surface import node_exporter_collectors
from nvdaemon.configload import parse_config
from nvdaemon.tiers import CollectorRunner, collect_tier
from tests.node_exporter.conftest import HOSTS, ROOT
from tests.node_exporter.exposition import parse
from tests.node_exporter.oracle import (
    TIME_DEPENDENT,
    compare,
    free_port,
    options_for,
    ours,
    scrape,
    textfile_dir,
    theirs,
)
from tests.polling import until_sync

GPUNODE = HOSTS / "gpunode"
ALL = sorted(DEFAULTS)

CONFIG = """
node: fixture-node
tiers: [core]
intervalSeconds: 0.5
stateDir: {state}
sinks:
  metrics: {{listenAddr: "127.0.0.1:{port}"}}
nodeExporter:
  enabled: true
  textfileDirectory: {textfile}
"""

# Values that stay put between two scrapes of a live machine; every other family is compared by labels only.
STABLE_ON_A_LIVE_HOST = frozenset(
    {
        "node_boot_time_seconds",
        "node_cpu_frequency_max_hertz",
        "node_cpu_frequency_min_hertz",
        "node_disk_info",
        "node_entropy_pool_size_bits",
        "node_filefd_maximum",
        "node_filesystem_files",
        "node_filesystem_readonly",
        "node_filesystem_size_bytes",
        "node_filesystem_device_error",
        "node_memory_MemTotal_bytes",
        "node_memory_SwapTotal_bytes",
        "node_network_info",
        "node_network_mtu_bytes",
        "node_network_address_assign_type",
        "node_network_device_id",
        "node_network_iface_id",
        "node_network_iface_link",
        "node_network_iface_link_mode",
        "node_network_net_dev_group",
        "node_network_protocol_type",
        "node_network_transmit_queue_length",
        "node_nf_conntrack_entries_limit",
        "node_nvme_info",
        "node_os_info",
        "node_os_version",
        "node_scrape_collector_success",
        "node_uname_info",
    }
)


@contextlib.contextmanager
def agent_metrics(tmp_path: Path, host: Path) -> Iterator[str]:
    config = tmp_path / "config.yaml"
    port = free_port()
    config.write_text(CONFIG.format(state=tmp_path / "state", textfile=textfile_dir(host), port=port))
    log = (tmp_path / "agent.log").open("wb")
    cmd = [sys.executable, "-m", "nvdaemon", "run", "--host-root", str(host), "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def first_cycle_ran() -> bool:  # once a node_scrape_collector_success series is there
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            try:
                return "node_scrape_collector_success" in scrape(url)
            except OSError:
                return False

        until_sync(first_cycle_ran, "node_* families on /metrics", timeout=30)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


AGENT_OWN = ("nodevitals_", "process_", "python_", "DCGM_", "smartctl_")


def node_only(text: str) -> str:
    """Our exposition without the agent's own families (textfile families keep whatever names they have)."""
    keep = [ln for ln in text.splitlines() if not _family_of(ln).startswith(AGENT_OWN)]
    return "\n".join(keep) + "\n"


def _family_of(line: str) -> str:
    return line.split(" ", 3)[2] if line.startswith("#") else line.split("{", 1)[0].split(" ", 1)[0]


def test_agent_serves_every_family_node_exporter_serves(node_exporter_binary: str, tmp_path: Path) -> None:
    with agent_metrics(tmp_path, GPUNODE) as url:
        our_text = scrape(url)
    their_text = theirs(GPUNODE, options_for(GPUNODE), ALL)
    diffs = compare(their_text, node_only(our_text))
    assert not diffs, f"{len(diffs)} difference(s) from node_exporter:\n" + "\n".join(diffs)
    families = parse(their_text)
    for name in ALL:  # every collector ran and succeeded on the host built to exercise it
        assert families["node_scrape_collector_success"].samples[(("collector", name),)] == 1.0, name
    assert "nodevitals_hw_load1" in our_text  # the hardware surface is still there beside it
    promtool = shutil.which("promtool")
    if promtool is not None:
        # The combined exposition parses, and its node_* lint findings are node_exporter's own (upstream names such
        # as node_memory_MemTotal_bytes are not snake_case; dashboards depend on them, so we keep them).
        ours_rc, our_findings = promtool_findings(promtool, our_text)
        _, their_findings = promtool_findings(promtool, their_text)
        assert ours_rc in (0, 3), our_findings
        node_findings = {f for f in our_findings if f.startswith("node_")}
        assert node_findings <= their_findings, sorted(node_findings - their_findings)


def promtool_findings(promtool: str, text: str) -> tuple[int, set[str]]:
    """promtool check metrics: exit code (0 clean, 3 lint findings, 1 unparsable) and its finding lines."""
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False)
    lines = (result.stdout + result.stderr).decode().splitlines()
    return result.returncode, {ln.strip() for ln in lines if ln.strip()}


@pytest.mark.parametrize("reads", ["opened", "held"])
def test_this_machine(node_exporter_binary: str, reads: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same comparison on this machine's /proc and /sys: labels always, values where they cannot move. Twice:
    with every file opened, then with the procfs and sysfs files read through the descriptors the first collection
    left held (``collectors/heldfiles.py``)."""
    root = Path("/")
    options = options_for(root, textfileDirectory="")
    held = HeldFiles()
    monkeypatch.setattr(base, "HELD", held)
    try:
        if reads == "held":
            ours(root, options, ALL)
            assert len(held) > 0 and held.opened == len(held), "the first collection left its pseudo files held"
        opened = held.opened
        their_text = theirs(root, options, ALL)
        our_text = ours(root, options, ALL)
        assert (held.opened == opened) is (reads == "held"), "held: no file opened to be held again"
    finally:
        held.close()
    moving = frozenset(parse(their_text)) - STABLE_ON_A_LIVE_HOST | TIME_DEPENDENT
    diffs = compare(their_text, our_text, time_dependent=moving)
    assert not diffs, f"{len(diffs)} difference(s) from node_exporter on this machine:\n" + "\n".join(diffs)


def gpunode_core_collectors() -> list[Collector]:
    """The core tier's collectors with every node_exporter collector on by default, configured for gpunode."""
    loaded = parse_config(
        f"nodeExporter: {{enabled: true, textfileDirectory: {textfile_dir(GPUNODE)}}}\n", "t.yaml", env={}
    )
    return tier_collectors(loaded.config, "core")


def test_reads_are_shared_with_the_hardware_surface() -> None:
    collectors = gpunode_core_collectors()

    async def cycle() -> tuple[int, int]:
        runners = [CollectorRunner(c, trio.CapacityLimiter(4)) for c in collectors]
        snap = await collect_tier("core", runners, HostRoots.under(GPUNODE), 5.0)
        assert snap.reads is not None
        return snap.reads.reads, snap.reads.shared

    reads, shared = trio.run(cycle)
    # loadavg, stat, meminfo, net/dev, diskstats, pressure, hwmon and powercap files are read by both surfaces.
    assert shared >= 8, (reads, shared)


def test_a_tick_leaves_no_garbage_for_the_cycle_collector() -> None:
    """A core tick with the node_* surface on gpunode, where some of the files asked for are missing: what it read
    is freed by reference counting as the tick ends. A missing file's error, raised again to each
    reader, used to hold the frames it went through, and with them the cycle's whole cache: some 4,500 objects a
    tick that only the cyclic garbage collector could free."""
    collectors = gpunode_core_collectors()

    async def ticks() -> tuple[int, int]:
        runners = [CollectorRunner(c, trio.CapacityLimiter(4)) for c in collectors]
        roots = HostRoots.under(GPUNODE)
        await collect_tier("core", runners, roots, 5.0)  # the first tick caches what never changes
        gc.collect()
        failed = 0
        for _ in range(3):
            snap = await collect_tier("core", runners, roots, 5.0)
            failed += sum(not st.success or not st.present for st in snap.collectors.values())
        del snap
        return gc.collect(), failed

    gc.disable()
    try:
        garbage, failed = trio.run(ticks)
    finally:
        gc.enable()
    assert failed > 0, "the fixture has collectors that meet missing files"
    assert garbage < 100, f"{garbage} objects of 3 ticks were left to the cycle collector"


def test_surface_is_off_by_default() -> None:
    loaded = parse_config("tiers: [core]\n", "t.yaml", env={})
    assert node_exporter_collectors(loaded.config, TABLE) == []


@pytest.mark.parametrize(
    ("yaml_text", "path"),
    [
        ("nodeExporter: {collectors: {cpus: false}}", "nodeExporter.collectors.cpus"),
        ("nodeExporter: {diskstats: {deviceExclude: '^(sd'}}", "nodeExporter.diskstats.deviceExclude"),
        ("nodeExporter: {filesystem: {mountPointsExclude: '['}}", "nodeExporter.filesystem.mountPointsExclude"),
        ("nodeExporter: {netdev: {deviceIncldue: eth0}}", "nodeExporter.netdev.deviceIncldue"),
        ("nodeExporter: {filesystem: {mountTimeoutSeconds: 0}}", "nodeExporter.filesystem.mountTimeoutSeconds"),
    ],
)
def test_bad_node_exporter_config_is_named(yaml_text: str, path: str) -> None:
    from nvdaemon.config import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_config(yaml_text + "\n", "t.yaml", env={})
    assert path in str(err.value)


def test_collectors_toggle_over_node_exporters_defaults() -> None:
    loaded = parse_config("nodeExporter: {enabled: true, collectors: {cpu: false}}\n", "t.yaml", env={})
    names = {c.name for c in node_exporter_collectors(loaded.config, TABLE)}
    assert "node_exporter.cpu" not in names
    assert "node_exporter.loadavg" in names
    assert len(names) == len(DEFAULTS) - 1
