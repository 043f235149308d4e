"""Peak RSS of the agent for each pod shape the chart renders (deploy/chart): 64 MiB or less for every shape without
NVSentinel (the Go chart's ``limits: {memory: 64Mi}``), 80 MiB or less for a shape with it (its call goes through
grpcio and protobuf, about 15 MiB more; the Go agent never spoke to NVSentinel). The chart's resources come from
these figures, per shape.

Each shape is ``nvdaemon run`` with the config the chart's ``nvdaemon.config`` template renders for that pod
(``tiers``, the tier's rules from values.yaml's ``rules``/``smartRules``/``gpuRules``, ``history``, ``webhooks``,
``nvsentinel``, ``dcgmCompat``, ``smartctlCompat``), with the node's paths pointed at fixtures and loopback peers:

- ``core``: the core pod with a webhook and history (``history.enabled``, one entry in ``webhooks``);
- ``smart``: the smart pod (the stand-in smartctl of ``fixtures/smartctl`` over ``fixtures/hosts/disks``'s four
  disks, as tests/smart and bench/steady.py wire it; smartctlCompat on), with the same webhook and history;
- ``gpu``: the gpu pod with dcgmCompat on and 8 GPUs (the fake NVML replaying the 8-GPU thermal-throttle scenario,
  as bench/steady.py does), with the same webhook and history;
- ``single``: singlePod with the core, smart and gpu tiers, webhook, history and NVSentinel (the test connector of
  tests/nvsentinel/connector.py on a Unix socket), dcgmCompat and smartctlCompat on;
- ``core, node page open``: the core pod as above with the event stream on, while headless Chromium holds the node
  page (``GET /``) open on it: the page's status reads, its websocket and its history plots (tests/browser's
  harness; the row is left out, saying why, where Chromium is not installed);
- ``core, 100,000 spooled``: the core pod whose webhook spool holds 100,000 events for an endpoint that is down
  (the spool bench/webhook.py fills).

The chart's 15 s interval (300 s for SMART) is shortened to TICK (and SMART to every 3 ticks) so TICKS ticks fit in
a few seconds: peak RSS depends on what has run (every tier, sink and route at least once), not on how long the
agent waited in between. Once ready, each agent ticks TICKS times, is scraped once per tick (/metrics, /v1/status),
and sees a rule's condition enter (core: the host's /proc/loadavg is raised over load_high's threshold; gpu: the
scenario heats the GPUs over gpu_hot), so events reach the webhook receiver (and the connector). The figure is the
agent process's VmHWM (/proc/<pid>/status) at the end; the smartctl stand-in's own processes are not counted.
"""

from __future__ import annotations

import contextlib
import http.client
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.common import FIXTURES, ROOT, SECRET, AgentProcess, free_port, gpunode_with_disks, peak_rss_kib
from bench.table import Row, Target

TICK = 1.0  # seconds between ticks (the chart's 15 s, shortened: see the docstring)
TICKS = 12
TARGET = Target("value", "<=", 64.0)  # a shape without NVSentinel
TARGET_NVSENTINEL = Target("value", "<=", 80.0)  # a shape that sends to NVSentinel
SCENARIO = FIXTURES / "nvml" / "h100-8gpu-thermal-throttle.json"
STANDIN = FIXTURES / "smartctl" / "smartctl"
CHART_VALUES = ROOT / "deploy" / "chart" / "values.yaml"
LOADAVG_HIGH = "64.00 64.00 64.00 9/1234 4321\n"  # over the chart's load_high threshold (8)


def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(CHART_VALUES.read_text())
    return values


def shape_config(tiers: list[str], state: Path, webhook_url: str, nvsentinel: dict[str, Any] | None) -> dict[str, Any]:
    """The agent config the chart renders for a pod running ``tiers`` with history, one webhook, dcgmCompat and
    smartctlCompat on (and NVSentinel when given), with the chart's paths replaced by this run's."""
    values = chart_values()
    rules: list[dict[str, Any]] = []
    for tier, key in (("core", "rules"), ("smart", "smartRules"), ("gpu", "gpuRules")):
        if tier in tiers:
            rules += values[key]
    history = {k: v for k, v in values["history"].items() if k not in ("hostPath", "mountPath", "chownImage")}
    config: dict[str, Any] = {
        "node": "bench-node",
        "tiers": tiers,
        "intervalSeconds": TICK,
        "shutdownGraceSeconds": values["shutdownGraceSeconds"],
        "stateDir": str(state),
        "rules": rules,
        "history": {**history, "enabled": True, "dataDir": str(state / "history")},
        "dcgmCompat": {"enabled": True},
        "smartctlCompat": {"enabled": True},
        "sinks": {"webhook": [{"url": webhook_url, "secret": SECRET}]},
    }
    if "smart" in tiers:
        config["smart"] = {**values["smart"], "intervalSeconds": 3 * TICK, "smartctlPath": str(STANDIN)}
    if "gpu" in tiers:
        config["gpu"] = {**values["gpu"], "backend": "fake", "fakeScenario": str(SCENARIO)}
    if nvsentinel is not None:
        config["sinks"]["nvsentinel"] = nvsentinel
    return config


def exercise(agent: AgentProcess, root: Path) -> None:
    """TICKS ticks, one scrape of /metrics and /v1/status per tick; the load rises over load_high after two."""
    conn = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)
    try:
        for tick in range(TICKS):
            if tick == 2:
                (root / "proc" / "loadavg").write_text(LOADAVG_HIGH)
            for path in ("/metrics", "/v1/status"):
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
            time.sleep(TICK)
    finally:
        conn.close()


def measure(tiers: list[str], with_nvsentinel: bool = False, page: bool = False) -> tuple[float, int]:
    """Peak RSS (MiB) of an agent running the shape's config through TICKS ticks, and the events its webhook
    receiver got (so a run whose rules raised nothing shows it). ``page``: with the event stream on and the node
    page open in headless Chromium from before the first tick to the end."""
    from tests.sinks.receiver import Receiver

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nvdaemon-rss-")))
        root = gpunode_with_disks(tmp)
        rx = stack.enter_context(Receiver(SECRET))
        nvsentinel = None
        if with_nvsentinel:
            from tests.nvsentinel.connector import FakeConnector

            token, socket = tmp / "token", tmp / "pc.sock"
            token.write_text("bench-token")
            connector = FakeConnector(socket, "bench-node", token).start()
            stack.callback(connector.stop)
            values = chart_values()["nvsentinel"]
            nvsentinel = {
                "enabled": True,
                "agent": values["agent"],
                "processingStrategy": values["processingStrategy"],
                "healthyBaseline": values["healthyBaseline"],
                "socketPath": str(socket),
                "tokenPath": str(token),
            }
        config = shape_config(tiers, tmp / "state", rx.url, nvsentinel)
        if page:
            config["sinks"]["stream"] = {"enabled": True}
        agent = stack.enter_context(AgentProcess(config, root))
        if page:
            from tests.browser.chromium import open_browser

            browser = stack.enter_context(open_browser(1366, 900))
            browser.get(f"http://127.0.0.1:{agent.port}/")
        exercise(agent, root)
        if page:
            opened = browser.execute_script("return [document.body.dataset.ws, document.body.dataset.statusLoads]")
            assert opened[0] == "open" and int(opened[1] or 0) > 1, f"the page did not run: {opened}"
        return peak_rss_kib(agent.pid) / 1024, len(rx.ids())


def measure_spooled() -> tuple[float, dict[str, Any]]:
    """Peak RSS (MiB) of the core pod whose webhook spool holds bench/webhook.py's SPOOLED events for an endpoint
    that is down, and that spool's figures."""
    from bench.webhook import fill_spool

    down = f"http://127.0.0.1:{free_port()}/hook"
    with tempfile.TemporaryDirectory(prefix="nvdaemon-rss-") as name:
        tmp = Path(name)
        root = gpunode_with_disks(tmp)
        spool = fill_spool(tmp / "state", down)
        agent_config = shape_config(["core"], tmp / "state", down, None)
        with AgentProcess(agent_config, root) as agent:
            exercise(agent, root)
            return peak_rss_kib(agent.pid) / 1024, spool


SHAPES: list[tuple[str, str, Callable[[], tuple[float, int]], Target]] = [
    ("core", "core pod, webhook+history", lambda: measure(["core"]), TARGET),
    ("smart", "smart pod, 4 disks, webhook+history", lambda: measure(["smart"]), TARGET),
    ("gpu", "gpu pod, dcgmCompat, 8 GPUs, webhook+history", lambda: measure(["gpu"]), TARGET),
    (
        "single",
        "singlePod, 3 tiers, webhook+history+NVSentinel",
        lambda: measure(["core", "smart", "gpu"], True),
        TARGET_NVSENTINEL,
    ),
]


def page_shape() -> list[tuple[str, str, Callable[[], tuple[float, int]], Target]]:
    """The node-page shape, where a browser can be opened here (else it says why and is left out)."""
    from tests.browser.chromium import missing_browser

    reason = missing_browser()
    if reason is not None:
        print(f"rss: no row for the node page: {reason}")
        return []
    return [("page", "core pod, webhook+history+stream, node page open", lambda: measure(["core"], page=True), TARGET)]


def run() -> tuple[list[Row], dict[str, Any]]:
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for key, label, how, target in SHAPES + page_shape():
        mib, events = how()
        raw[f"rss_peak_{key}_mib"] = mib
        raw[f"rss_{key}_webhook_events"] = events
        rows.append(Row(f"peak RSS, {label}", mib, "MiB", target=target))
    mib, spool = measure_spooled()
    raw["rss_peak_core_spooled_mib"] = mib
    raw.update({f"rss_{k}": v for k, v in spool.items()})
    rows.append(Row(f"peak RSS, core pod, {spool['spooled_events']:,} spooled", mib, "MiB", target=TARGET))
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
