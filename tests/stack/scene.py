"""The stack under test: one agent (subprocess) with every surface on, the stand-ins it talks to, and a real
Prometheus scraping it with the chart's rules loaded.

- Host: a copy of fixtures/hosts/healthy with the fixture disks in dev/; SMART through the stand-in smartctl on a
  copy of its recordings, sdb and nvme1n1 edited to healthy values (``disks_faulty``/``disks_healthy`` swap the
  recorded faulty reports in and out, as a disk would degrade and be replaced).
- GPUs: the fake NVML on the healthy H100 scenario. A second, GPU-only agent (``gpu_agent``) replays a scenario that
  crosses the GPU thresholds and clears them; Prometheus finds it through a file_sd file.
- Sinks: a webhook to a real loopback receiver, NVSentinel to the test platform-connector on a Unix socket.
  ``reload`` rewrites the config (e.g. history turned on) and sends SIGHUP, as an operator's config change does.
- Prometheus: the chart's PrometheusRule rendered by the real helm (hardware group on, every ``for:`` set to 1s
  through ``prometheusRule.forOverride``, errorWindow 10s, taskRestartWindow 15s), the agents in job
  ``nv-nvdaemon-metrics`` with the ``namespace``/``pod`` labels a ServiceMonitor scrape adds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tests.deploy import helm
from tests.nvsentinel.conftest import TOKEN
from tests.nvsentinel.connector import FakeConnector
from tests.sinks.helpers import SECRET
from tests.sinks.receiver import Receiver
from tests.smart.conftest import RECORDINGS, STANDIN
from tests.stack.prometheus import Prometheus, poll
from tests.test_e2e import ROOT, Agent, free_port

JOB = f"{helm.RELEASE}-nvdaemon-metrics"  # the job the chart's ServiceMonitor scrapes as (NvdaemonAgentDown)
NODE = "stack-node"
GPU_NODE = "stack-gpu-node"
NAMESPACE = helm.NAMESPACE
POD = "nv-nvdaemon-agent-s7k2p"
GPU_POD = "nv-nvdaemon-gpu-q4x9m"
ERROR_WINDOW = "10s"
# Holds the first 4 restarts of a crash loop (within 7.5 s: the supervisor's backoff, 0.5 s doubling) and the
# scrape before them; short, so that the alert resolves soon after the loop ends.
TASK_RESTART_WINDOW = "15s"
SMART_INTERVAL = 1.0  # 3 intervals (the stuck rule) leave room for a slow tick on a busy machine
HIGH_LOAD, LOW_LOAD = "24.51 20.10 18.00 9/1024 123456\n", "0.52 0.61 0.58 2/1024 123456\n"

# (device, recorded text, healthy text) replacements that make the faulty recordings healthy.
HEALTHY_EDITS: dict[str, list[tuple[str, str]]] = {
    "sdb": [
        ("Always       -       1064", "Always       -       0"),
        ("Always       -       24\n", "Always       -       0\n"),
    ],
    "nvme1n1": [
        (
            "SMART overall-health self-assessment test result: FAILED!",
            "SMART overall-health self-assessment test result: PASSED",
        ),
        ("- available spare has fallen below threshold\n", ""),
        ("Critical Warning:                   0x05", "Critical Warning:                   0x00"),
        ("Available Spare:                    6%", "Available Spare:                    100%"),
        ("Percentage Used:                    97%", "Percentage Used:                    3%"),
    ],
}

CONFIG: dict[str, Any] = {
    "node": NODE,
    "tiers": ["core", "smart", "gpu"],
    "intervalSeconds": 0.5,
    "shutdownGraceSeconds": 5,
    "collectorTimeoutSeconds": 5,
    "smart": {"smartctlPath": str(STANDIN), "intervalSeconds": SMART_INTERVAL, "timeoutSeconds": 30},
    "gpu": {"backend": "fake", "fakeScenario": str(ROOT / "fixtures" / "nvml" / "h100-8gpu-healthy.json")},
    "nodeExporter": {"enabled": True},
    "dcgmCompat": {"enabled": True},
    "smartctlCompat": {"enabled": True},
    "rules": [
        {"metric": "load1", "device": "cpu", "condition": "load_high", "threshold": 16, "enterFor": 1, "exitFor": 1}
    ],
}


def rule_groups() -> list[dict[str, Any]]:
    values = {
        "enabled": True,
        "forOverride": "1s",
        "taskRestartWindow": TASK_RESTART_WINDOW,
        "hardware": {"enabled": True, "errorWindow": ERROR_WINDOW},
    }
    (rule,) = helm.render({"prometheusRule": values}).kind("PrometheusRule")  # skips without helm
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def gpu_scenario(healthy_ticks: int, hot_ticks: int) -> dict[str, Any]:
    """The healthy H100 scenario for ``healthy_ticks``, then for ``hot_ticks``: gpu5 at 91 C, gpu3 lost after
    XID 79, and 2 uncorrected ECC errors on gpu1 (one more halfway: Prometheus sees an increase even if its first
    scrape came after the first jump); then gpu5 cools down and gpu3 answers again."""
    doc: dict[str, Any] = json.loads((ROOT / "fixtures" / "nvml" / "h100-8gpu-healthy.json").read_text())
    half = hot_ticks // 2
    doc["steps"] = [
        *([{}] * healthy_ticks),
        {
            "readings": {"5": {"temperature_gpu": 91}, "1": {"ecc_uncorrected_aggregate": 2}},
            "xids": [{"gpu": 3, "xid": 79}],
            "lost": [3],
        },
        *([{}] * (half - 1)),
        {"readings": {"1": {"ecc_uncorrected_aggregate": 3}}},
        *([{}] * (hot_ticks - half - 1)),
        {"readings": {"5": {"temperature_gpu": 44}}, "recovered": [3]},
    ]
    return doc


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.host = tmp / "host"
        shutil.copytree(ROOT / "fixtures" / "hosts" / "healthy", self.host, symlinks=True)
        for node in (ROOT / "fixtures" / "hosts" / "disks" / "dev").iterdir():
            shutil.copy(node, self.host / "dev" / node.name, follow_symlinks=False)
        # Files every Linux host has that the healthy fixture lacks; without them node_exporter's entropy collector
        # fails (as upstream's does) and NvdaemonCollectorFailing would fire on a healthy node.
        random = self.host / "proc" / "sys" / "kernel" / "random"
        random.mkdir(parents=True, exist_ok=True)
        (random / "entropy_avail").write_text("256\n")
        (random / "poolsize").write_text("256\n")
        self.recordings = tmp / "recordings"
        shutil.copytree(RECORDINGS, self.recordings)
        self.disks_healthy()
        self.smart_log = tmp / "smartctl.log"
        self.receiver = Receiver(secret=SECRET)  # its port is chosen now; started in start()
        self.socket = tmp / "pc.sock"
        self.agent_token = tmp / "agent-token"
        self.agent_token.write_text(TOKEN)
        self.connector = FakeConnector(self.socket, NODE, self.agent_token)
        self.port = free_port()
        self.config: dict[str, Any] = {
            **CONFIG,
            "stateDir": str(tmp / "state"),
            "sinks": {
                "metrics": {"listenAddr": f"127.0.0.1:{self.port}"},
                "webhook": [
                    {"url": self.receiver.url, "secret": SECRET, "backoffBaseSeconds": 0.1, "backoffMaxSeconds": 0.3}
                ],
                "nvsentinel": {
                    "enabled": True,
                    "socketPath": str(self.socket),
                    "tokenPath": str(self.agent_token),
                    "retryInitialSeconds": 0.1,
                    "maxAttempts": 2,
                },
            },
        }
        (tmp / "config.yaml").write_text(json.dumps(self.config, indent=1))  # JSON is YAML; Agent reads the port
        self.agent = Agent(tmp, self.host, tmp / "config.yaml")
        self.gpu_agent: Agent | None = None
        self.targets = tmp / "gpu-targets.json"
        self.targets.write_text("[]")
        scrape = {
            "job_name": JOB,
            "static_configs": [{"targets": [f"127.0.0.1:{self.port}"], "labels": {"namespace": NAMESPACE, "pod": POD}}],
            "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": "1s"}],
        }
        self.prometheus = Prometheus(tmp / "prometheus", [scrape], rule_groups())
        self._toggler: threading.Thread | None = None
        self._env: dict[str, str | None] = {}
        self._toggling = threading.Event()
        self.started_at = 0.0

    def start(self) -> Stack:
        self.started_at = time.time()  # the dashboard test queries the whole run, however long a loaded machine took
        self._env = {var: os.environ.get(var) for var in ("SMARTCTL_STANDIN_DIR", "SMARTCTL_STANDIN_LOG")}
        os.environ["SMARTCTL_STANDIN_DIR"] = str(self.recordings)  # read by the stand-in the agent runs
        os.environ["SMARTCTL_STANDIN_LOG"] = str(self.smart_log)
        self.receiver.start()
        self.connector.start()
        self.agent.start()
        self.prometheus.start()
        return self

    def close(self) -> None:
        self.stop_toggling()
        self.agent.kill()
        if self.gpu_agent is not None:
            self.gpu_agent.kill()
        self.prometheus.stop()
        self.receiver.stop()
        self.connector.stop()
        for var, value in self._env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value

    # ---- causes ------------------------------------------------------------------------------------------------
    def disks_healthy(self) -> None:
        for device, edits in HEALTHY_EDITS.items():
            text = (RECORDINGS / device / "all.txt").read_text()
            for old, new in edits:
                assert old in text, f"{device}: recording changed, {old!r} not found"
                text = text.replace(old, new)
            (self.recordings / device / "all.txt").write_text(text)
            (self.recordings / device / "rc").write_text("0\n")

    def disks_faulty(self) -> None:
        """sdb with pending and reallocated sectors, nvme1n1 worn out (97 %) with critical warning 0x05: the
        recorded reports."""
        for device in HEALTHY_EDITS:
            for name in ("all.txt", "rc"):
                shutil.copy(RECORDINGS / device / name, self.recordings / device / name)

    def break_file(self, relative: str) -> Path:
        """Replace a host file by a directory: its read fails with EISDIR even for root, whom chmod does not stop."""
        path = self.host / relative
        saved = path.with_name(path.name + ".saved")
        path.rename(saved)
        path.mkdir()
        return saved

    def restore_file(self, relative: str) -> None:
        path = self.host / relative
        path.rmdir()
        path.with_name(path.name + ".saved").rename(path)

    def set_load(self, text: str) -> None:
        tmp = self.host / "proc" / "loadavg.tmp"
        tmp.write_text(text)
        tmp.replace(self.host / "proc" / "loadavg")

    def advance_cpu(self, busy: int = 40, idle: int = 60) -> None:
        """Add jiffies to every cpu line of proc/stat (user and idle), as time passing on a busy host does."""
        path = self.host / "proc" / "stat"
        lines = []
        for line in path.read_text().splitlines():
            f = line.split()
            if line.startswith("cpu"):
                f[1], f[4] = str(int(f[1]) + busy), str(int(f[4]) + idle)
            lines.append(" ".join(f) if line.startswith("cpu") else line)
        tmp = path.with_name("stat.tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)

    def start_toggling(self) -> None:
        """Flip load1 across the load_high threshold every 0.4 s (an ENTER or EXIT event each time), the CPU busy."""
        self._toggling.set()

        def run() -> None:
            high = True
            while self._toggling.is_set():
                self.set_load(HIGH_LOAD if high else LOW_LOAD)
                self.advance_cpu()
                high = not high
                time.sleep(0.4)
            self.set_load(LOW_LOAD)

        self._toggler = threading.Thread(target=run, daemon=True)
        self._toggler.start()

    def stop_toggling(self) -> None:
        self._toggling.clear()
        if self._toggler is not None:
            self._toggler.join(5)
            self._toggler = None

    def wait_settled_low(self) -> None:
        """Until the agent has read the low load and NVSentinel acknowledged the clear (nothing pending)."""

        def settled() -> bool:
            text = self.agent.get("/metrics")[1].decode()
            return (
                f'nodevitals_hw_load1{{device="cpu",node="{NODE}",tier="core"}} {LOW_LOAD.split(maxsplit=1)[0]}' in text
                and 'nodevitals_nvsentinel_pending{monitor="nvdaemon"} 0.0' in text
            )

        poll(settled, "load low and no NVSentinel difference pending")

    def connector_away(self) -> None:
        """The platform-connector gone, its socket with it."""
        self.connector.stop()

    def connector_dead_socket(self) -> None:
        """The platform-connector gone but its socket file left behind: connecting is refused (UNAVAILABLE)."""
        self.connector.stop()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(self.socket))
        s.close()  # bound, never listening: the file stays, connect() gets ECONNREFUSED

    def connector_back(self) -> None:
        self.socket.unlink(missing_ok=True)
        self.connector = FakeConnector(self.socket, NODE, self.agent_token).start()

    def reload(self, **changes: Any) -> None:
        """The config file rewritten as the base config with ``changes`` over its top-level keys (none: the base
        config again), then SIGHUP; returns once the agent has accepted it."""
        assert self.agent.proc is not None
        before = self.agent.status()["reloads"]
        (self.tmp / "config.yaml").write_text(json.dumps({**self.config, **changes}, indent=1))
        self.agent.proc.send_signal(signal.SIGHUP)
        after = poll(lambda: (r := self.agent.status()["reloads"]) != before and r, "the reload applied or rejected")
        assert after == {**before, "ok": before["ok"] + 1}, f"reload rejected: {after}; see {self.tmp / 'agent.log'}"

    def hung_smartctl(self) -> list[int]:
        """PIDs the stand-in logged as hanging (the run and its child)."""
        lines = self.smart_log.read_text().splitlines() if self.smart_log.exists() else []
        return [int(p) for line in lines if line.startswith("HANG ") for p in line.split()[1:3]]

    # ---- the second agent ----------------------------------------------------------------------------------------
    def start_gpu_agent(self, scenario: dict[str, Any]) -> Agent:
        tmp = self.tmp / "gpu-agent"
        tmp.mkdir(exist_ok=True)
        (tmp / "scenario.json").write_text(json.dumps(scenario))
        port = free_port()
        config = {
            "node": GPU_NODE,
            "tiers": ["gpu"],
            "intervalSeconds": 0.25,
            "shutdownGraceSeconds": 5,
            "stateDir": str(tmp / "state"),
            "gpu": {"backend": "fake", "fakeScenario": str(tmp / "scenario.json")},
            "dcgmCompat": {"enabled": True},
            "sinks": {"metrics": {"listenAddr": f"127.0.0.1:{port}"}, "stream": {"enabled": False}},
        }
        (tmp / "config.yaml").write_text(json.dumps(config, indent=1))
        agent = Agent(tmp, self.host, tmp / "config.yaml")
        agent.start()
        self.gpu_agent = agent
        self.targets.write_text(
            json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": NAMESPACE, "pod": GPU_POD}}])
        )
        instance = f"127.0.0.1:{port}"
        poll(lambda: self.prometheus.value(f'up{{instance="{instance}"}}') == 1, "the GPU agent scraped")
        return agent
