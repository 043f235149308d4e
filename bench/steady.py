"""Steady cost: CPU seconds per hour and peak RSS of the agent with every tier and sink on, against node_exporter.

Ours: ``nvdaemon run`` on a copy of ``fixtures/hosts/gpunode`` (plus the fixture disks of ``fixtures/hosts/disks``)
with the core, smart (the stand-in smartctl, smartctlCompat on) and gpu (the fake NVML replaying the 8-GPU
thermal-throttle scenario, dcgmCompat on) tiers, the rules of ``examples/{local,smart,gpu}.yaml``, and the webhook
(a loopback receiver, ``tests/sinks/receiver.py``), stream (one websocket client on /v1/events) and NVSentinel
(``tests/nvsentinel/connector.py`` on a Unix socket) sinks. It ticks every 1 s (the SMART tier every 20 s: its
default 300 s, 15 times faster like the rest) for STEADY seconds (``BENCH_STEADY_SECONDS``, 180 by default) after a
warm-up, and is scraped once a second. Its CPU (utime+stime of the agent process; the smartctl stand-in it spawns is
not counted, being a Python stand-in for a C tool: reported apart) is scaled to a 15 s interval: x 3600 / 15 per
hour of measured seconds. Fixed costs that do not scale with the interval (timers, keepalives) are scaled down too.
(The agent ticks by the clock; the scrape loop may fall a little behind it on a loaded machine.)

Reference: node_exporter (every collector, the oracle's flags) on the same host root, scraped once a second over
the same seconds, scaled by the scrapes it answered (its work is per scrape): CPU / scrapes x 240 per hour.
RSS: the peak (VmHWM) of each process at the end.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import FIXTURES, ROOT, SECRET, AgentProcess, EventClient, copy_host, cpu_seconds, peak_rss_kib
from bench.scrape import NodeExporter, collectors, reference, scrape
from bench.table import Row, Target
from tests.nvsentinel.connector import FakeConnector
from tests.sinks.receiver import Receiver

INTERVAL = 1.0
SCALE_TO = 15.0
WARMUP = 5.0
TOKEN = "bench-token"
SCENARIO = FIXTURES / "nvml" / "h100-8gpu-thermal-throttle.json"
STANDIN = FIXTURES / "smartctl" / "smartctl"
CPU_TARGET = Target("ratio", "<=", 1.0)
RSS_TARGET = Target("value", "<=", 64.0)


def seconds() -> float:
    return float(os.environ.get("BENCH_STEADY_SECONDS", "180"))


def host(tmp: Path) -> Path:
    """gpunode with the fixture disks under dev/ and a boot id (the NVSentinel sink reads it)."""
    root = copy_host("gpunode", tmp)
    (root / "dev").mkdir(exist_ok=True)
    for node in (FIXTURES / "hosts" / "disks" / "dev").iterdir():
        shutil.copy(node, root / "dev" / node.name, follow_symlinks=False)
    return root


def rules() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in ("local", "smart", "gpu"):
        out += yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())["rules"]
    return out


def agent_config(tmp: Path, receiver: Receiver, socket: Path, token: Path) -> dict[str, Any]:
    return {
        "node": "bench-node",
        "tiers": ["core", "smart", "gpu"],
        "intervalSeconds": INTERVAL,
        "smart": {"smartctlPath": str(STANDIN), "intervalSeconds": 300 / SCALE_TO, "timeoutSeconds": 10},
        "smartctlCompat": {"enabled": True},
        "gpu": {"backend": "fake", "fakeScenario": str(SCENARIO)},
        "dcgmCompat": {"enabled": True},
        "sinks": {
            "webhook": [{"url": receiver.url, "secret": SECRET}],
            "nvsentinel": {"enabled": True, "socketPath": str(socket), "tokenPath": str(token)},
            "stream": {"enabled": True},
        },
        "rules": rules(),
    }


def per_hour(cpu: float, measured: float) -> float:
    """CPU seconds per hour at a SCALE_TO interval, from CPU seconds over ``measured`` seconds at INTERVAL."""
    return cpu / measured * 3600 * INTERVAL / SCALE_TO


def run() -> tuple[list[Row], dict[str, Any]]:
    duration = seconds()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nvdaemon-steady-")))
        root = host(tmp)
        token = tmp / "token"
        token.write_text(TOKEN)
        socket = tmp / "pc.sock"
        receiver = stack.enter_context(Receiver(SECRET))
        connector = FakeConnector(socket, "bench-node", token).start()
        stack.callback(connector.stop)
        agent = stack.enter_context(AgentProcess(agent_config(tmp, receiver, socket, token), root))
        client = EventClient(agent.port).start()
        stack.callback(client.stop)
        ne: NodeExporter | None = stack.enter_context(reference(root, collectors()))
        conns = [http.client.HTTPConnection("127.0.0.1", agent.port, timeout=10)]
        pids = {"ours": agent.pid}
        if ne is not None:
            conns.append(http.client.HTTPConnection("127.0.0.1", ne.port, timeout=10))
            pids["theirs"] = ne.pid
        time.sleep(WARMUP)
        cpu0 = {who: cpu_seconds(pid) for who, pid in pids.items()}
        children0 = cpu_seconds(agent.pid, children=True)
        began = time.monotonic()
        tick = 0
        slowest = dict.fromkeys(pids, 0.0)
        while time.monotonic() - began < duration:
            for who, conn in zip(pids, conns, strict=True):  # both scraped at the same rate, once a second
                t0 = time.perf_counter()
                scrape(conn)
                slowest[who] = max(slowest[who], time.perf_counter() - t0)
            tick += 1
            time.sleep(max(0.0, began + tick * INTERVAL - time.monotonic()))
        measured = time.monotonic() - began
        cpu = {who: cpu_seconds(pid) - cpu0[who] for who, pid in pids.items()}
        raw: dict[str, Any] = {
            "steady_seconds": measured,
            "steady_scrapes": tick,
            "steady_ours_cpu_s": cpu["ours"],
            "steady_ours_children_cpu_s": cpu_seconds(agent.pid, children=True) - children0,
            "steady_ours_cpu_s_per_hour_15s": per_hour(cpu["ours"], measured),
            "steady_ours_peak_rss_mib": peak_rss_kib(agent.pid) / 1024,
            "steady_ours_slowest_scrape_ms": slowest["ours"] * 1000,
            "steady_webhook_received": len(receiver.ids()),
            "steady_nvsentinel_calls": len(connector.calls()),
            "steady_stream_events": len(client.events()),
        }
        if ne is not None:
            raw["steady_theirs_cpu_s"] = cpu["theirs"]
            # node_exporter works per scrape: scaled by the scrapes it answered (one per 15 s, 240 an hour)
            raw["steady_theirs_cpu_s_per_hour_15s"] = cpu["theirs"] / tick * 3600 / SCALE_TO
            raw["steady_theirs_slowest_scrape_ms"] = slowest["theirs"] * 1000
            raw["steady_theirs_peak_rss_mib"] = peak_rss_kib(ne.pid) / 1024
        for conn in conns:
            conn.close()
    missing = "not installed"
    rows = [
        Row(
            "steady CPU/hour at 15 s, all tiers+sinks",
            raw["steady_ours_cpu_s_per_hour_15s"],
            "s",
            raw.get("steady_theirs_cpu_s_per_hour_15s", missing),
            CPU_TARGET,
        ),
        Row(
            "steady peak RSS, all tiers+sinks",
            raw["steady_ours_peak_rss_mib"],
            "MiB",
            raw.get("steady_theirs_peak_rss_mib", missing),
            RSS_TARGET,
        ),
    ]
    return rows, raw


if __name__ == "__main__":
    from bench.table import run_alone

    run_alone(run)
