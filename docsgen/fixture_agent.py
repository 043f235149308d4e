"""``/metrics`` of an agent on the fixture hosts with every surface on, rendered in-process, and parsed back.

The families the agent can expose are taken from its own exposition, not from a list: an agent is built from a
config enabling every tier, sink and compatibility surface, its tiers are collected from the fixture hosts
(``fixtures/hosts``: core and the node_exporter collectors on healthy, faulty and gpunode; smart on disks through the
smartctl stand-in, ``fixtures/smartctl``; gpu on the fake NVML's thermal-throttle H100 scenario, with one XID raised),
and ``MetricsCache`` renders ``/metrics``, which ``promtext.parse_text`` reads back. On the first host the
webhook endpoints and the NVSentinel sink are also served against stand-ins in this process until each family they
expose has a series (``fixture_sinks``); the other sinks are built, never started. Nothing listens, nothing leaves
the process. A family whose HELP and TYPE are exposed without a series stops the generator: its labels cannot be
read. Logging is off while it runs (the fixtures' gaps and the sinks' failures log warnings).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import msgspec
import trio

from docsgen import ROOT
from docsgen.fixture_sinks import SOCKET, TOKEN, WEBHOOKS, serve_sinks, stand_ins
from nvdaemon.app import Agent
from nvdaemon.collectors import collectors_for_tier
from nvdaemon.collectors.base import Collector, HostRoots
from nvdaemon.compat.node_exporter import TABLE
from nvdaemon.compat.node_exporter.surface import node_exporter_collectors
from nvdaemon.configload import parse_config
from nvdaemon.gpu import GpuRuntime
from nvdaemon.gpu.podresources import PodAttribution, PodResourcesClient
from nvdaemon.kmsg.position import KmsgPosition
from nvdaemon.nvml import XidNotice
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.promtext import TextFamily, parse_text
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.sinks import build_sinks
from nvdaemon.supervise import Supervisor, TaskState

FIXTURES = ROOT / "fixtures"
CORE_HOSTS = ("healthy", "faulty", "gpunode")
SCENARIO = FIXTURES / "nvml" / "h100-8gpu-thermal-throttle.json"
CONFIG = """\
node: docs
stateDir: {state}
tiers: [core, smart, gpu]
rules: [{{metric: load1, condition: docs_example, threshold: -1}}]
sinks:
  webhook: [{webhooks}]
  nvsentinel: {{enabled: true, socketPath: "{socket}", tokenPath: "{token}"}}
history: {{enabled: true}}
nodeExporter: {{enabled: true}}
dcgmCompat: {{enabled: true, podAttribution: true}}
smartctlCompat: {{enabled: true}}
smart: {{smartctlPath: "{smartctl}"}}
gpu: {{backend: fake, fakeScenario: "{scenario}"}}
"""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _second_tick(host: Path, tmp: Path) -> HostRoots:
    """The host with its /proc/stat moved on (busy and idle time of every cpu line), so the cpu percentages of a
    second tick exist; every other /proc entry is a link to the host's."""
    proc = tmp / "proc"
    proc.mkdir()
    for entry in (host / "proc").iterdir():
        if entry.name != "stat":
            (proc / entry.name).symlink_to(entry)
    lines = []
    for line in (host / "proc" / "stat").read_text().splitlines():
        f = line.split()
        if f and f[0].startswith("cpu"):
            f[1], f[4] = str(int(f[1]) + 30), str(int(f[4]) + 70)
        lines.append(" ".join(f))
    (proc / "stat").write_text("\n".join(lines) + "\n")
    return HostRoots(proc=proc, sys=host / "sys", dev=host / "dev", rootfs=host)


async def _collect(agent: Agent, tier: str, collectors: list[Collector], ticks: list[HostRoots]) -> None:
    from nvdaemon.tiers import CollectorRunner, collect_tier

    for c in collectors:
        c.configure(agent.loaded.config)
    runners = [CollectorRunner(c, trio.CapacityLimiter(4)) for c in collectors]
    for roots in ticks:
        snap = await collect_tier(tier, runners, roots, agent.loaded.config.collector_timeout_seconds)
    agent.on_snapshot(snap)


def _agent(host: str, tmp: Path) -> bytes:
    """``/metrics`` of the agent with the core tier on fixture host ``host``."""
    text = CONFIG.format(
        state=tmp / "state",
        smartctl=FIXTURES / "smartctl" / "smartctl",
        scenario=SCENARIO,
        webhooks=WEBHOOKS,
        socket=tmp / SOCKET,
        token=tmp / TOKEN,
    )
    agent = Agent(parse_config(text, "docs.yaml", env={}, host_root=FIXTURES / "hosts" / host))
    nvml = FakeNvml(SCENARIO)
    gpu = GpuRuntime(nvml, nvml.open(), node=agent.node)
    gpu.on_xids([XidNotice(0, 79)], now=0.0)  # gpu_xid_errors_total and DCGM_FI_DEV_XID_ERRORS have a series
    gpu.pod_attribution = PodAttribution(PodResourcesClient("kubelet.sock", 1.0))  # never called
    agent.gpu = gpu
    sinks = build_sinks(agent.sink_context())
    for sink in sinks:
        sink.attach(agent.bus)
        agent.sinks[sink.name] = sink

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            agent.supervisor = Supervisor(nursery)
            agent.supervisor.tasks["tier:core"] = TaskState("tier:core", critical=True, state="running")
            core = collectors_for_tier("core") + node_exporter_collectors(agent.loaded.config, TABLE)
            host_root = FIXTURES / "hosts" / host
            await _collect(agent, "core", core, [agent.roots, _second_tick(host_root, tmp)])
            if host == CORE_HOSTS[0]:  # smart's disks and the GPUs are fixtures of their own: once is enough
                disks = HostRoots.under(FIXTURES / "hosts" / "disks")
                await _collect(agent, "smart", collectors_for_tier("smart"), [disks])
                await _collect(agent, "gpu", gpu.collectors(), [agent.roots])
                _read_kernel_log(agent, tmp)
                with stand_ins(tmp, agent.loaded.state_dir):
                    await serve_sinks(agent)

    try:
        trio.run(run)
        return MetricsCache(agent).render()
    finally:
        for sink in sinks:
            sink.close()


def _read_kernel_log(agent: Agent, tmp: Path) -> None:
    """The kernel-log source over the kmsg fixture host, its records read once (in the trio run: the budget's
    clock), with a lookback that leaves its oldest records out, so every ``nodevitals_kmsg_*`` family has a series."""
    host = FIXTURES / "hosts" / "kmsg"
    c = agent.loaded.config
    c = msgspec.structs.replace(
        c,
        dev_root=str(host / "dev"),
        proc_root=str(host / "proc"),
        kernel_log=msgspec.structs.replace(c.kernel_log, lookback_seconds=3000.0),
    )
    source = agent.kmsg_source(c)
    source._begin(KmsgPosition())  # a first start: what the task does before it reads
    source.reader.open()
    try:
        for raw in source.reader.records(1000):
            source._record(raw)  # the task's per-record step, without its loop
    finally:
        source.reader.close()
    source.up = True
    agent.kmsg = source


def declared(text: bytes) -> set[str]:
    """The families the exposition has a TYPE line for, with a series or not (``parse_text`` keeps only those with
    one, as expfmt does)."""
    return {line.split()[2].decode() for line in text.splitlines() if line.startswith(b"# TYPE ")}


def exposed_families() -> dict[str, TextFamily]:
    """Every family on ``/metrics`` of the fixture agents, by name; a family's samples from every host together.
    ``RuntimeError`` names the families that the agents declare but gave no series on any host."""
    families: dict[str, TextFamily] = {}
    names: set[str] = set()
    with _quiet():
        for host in CORE_HOSTS:
            with tempfile.TemporaryDirectory(prefix="docsgen-") as tmp:
                text = _agent(host, Path(tmp))
                names |= declared(text)
                for name, fam in parse_text(text).items():
                    seen = families.setdefault(name, TextFamily(name, fam.help, fam.type))
                    seen.metrics.extend(fam.metrics)
    if empty := sorted(names - families.keys()):
        raise RuntimeError(f"families without a series on the fixture agents' /metrics: {', '.join(empty)}")
    return families
