"""A running agent (in process, fake NVML, 8 GPUs) against the test kubelet: DCGM labels follow pods as they come
and go, a time-sliced GPU shared by two containers, a MIG slice, and a kubelet that answers garbage, hangs and
disappears; the exposition checked by promtool, the events by the Standard Webhooks and CloudEvents verifiers of
the test receiver, and by ``nvdaemon tail`` on the live stream."""

from __future__ import annotations

import functools
import io
import json
import logging
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.tail import Options, Tail
from tests.gpu.conftest import HEALTHY
from tests.gpu.test_dcgm import GOLDEN, INHERENT
from tests.podres.kubelet import TestKubelet, pod
from tests.polling import until
from tests.sinks.helpers import SECRET
from tests.sinks.receiver import Receiver

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"
UUIDS = [d["uuid"] for d in json.loads(HEALTHY.read_text())["devices"]]
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # a counter the replay advances every tick (perTick, in mJ)
ENERGY_PER_TICK = int(json.loads(HEALTHY.read_text())["perTick"]["total_energy_mj"])
MIG7 = "MIG-7a1b2c3d-4e5f-5a6b-8c7d-9e0f1a2b3c4d"
TRAIN = pod("ml", "train", ("main", [(GPU, [UUIDS[0]])]), ("sidecar", []))
SHARED_A = pod("ml", "shared-a", ("worker", [(GPU, [UUIDS[1] + "::0"])]))
SHARED_B = pod("ml", "shared-b", ("worker", [(GPU, [UUIDS[1] + "::1"])]))
BY_INDEX = pod("batch", "by-index", ("main", [(GPU, ["2"])]))
MIG_SLICE = pod("mig", "slice", ("main", [("nvidia.com/mig-1g.10gb", [MIG7])]))
LATE = pod("ml", "late", ("main", [(GPU, [UUIDS[3]])]))

CONFIG = """
node: gpu-node
stateDir: {state}
intervalSeconds: 0.1
tiers: [gpu]
gpu: {{backend: fake, fakeScenario: '{scenario}'}}
kernelLog: {{enabled: false}}  # the host's kernel log (read as root) could add XIDs for the fake GPUs' addresses
dcgmCompat: {{enabled: true, podAttribution: true, podResourcesSocket: '{socket}', podResourcesTimeoutSeconds: 0.3}}
sinks:
  metrics: {{listenAddr: '127.0.0.1:0'}}
  webhook: [{{url: '{url}', secret: '{secret}', backoffBaseSeconds: 0.05, backoffMaxSeconds: 0.2}}]
rules:
  - {{metric: gpu_temperature_celsius, device: gpu0, condition: gpu_hot, threshold: 60}}
"""


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


wait_for = functools.partial(until, timeout=20.0, step=0.05)


def series(text: str, family: str, gpu: int) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f'{family}{{gpu="{gpu}",')]


POD_LABELS = ',container="{c}",namespace="{ns}",pod="{p}"}}'


async def test_pods_on_dcgm_series_and_events_through_kubelet_failures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvdaemon.gpu.podresources")
    scenario = json.loads(HEALTHY.read_text())
    scenario["devices"][7]["mig"] = [MIG7]  # GPU 7 is in MIG mode with one slice
    (tmp_path / "mig.json").write_text(json.dumps(scenario))
    sock = tmp_path / "kubelet.sock"
    rx = Receiver(secret=SECRET).start()
    kubelet = TestKubelet(sock).start()
    kubelet.set_pods(TRAIN, SHARED_A, SHARED_B, BY_INDEX, MIG_SLICE)
    text = CONFIG.format(
        state=tmp_path / "state", scenario=tmp_path / "mig.json", socket=sock, url=rx.url, secret=SECRET
    )
    agent = Agent(parse_config(text, "test.yaml", env={}))
    received: list[dict[str, Any]] = []

    def events(condition: str) -> list[dict[str, Any]]:
        with rx.lock:
            for r in rx.received[len(received) :]:
                assert r.verified and r.data is not None, "signature and CloudEvent envelope checked by the receiver"
                received.append(r.data)
        return [e for e in received if e["condition"] == condition]

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run)
            await wait_for(lambda: agent.ready, "ready")
            base = agent.bound[0]
            assert agent.gpu is not None and isinstance(agent.gpu.backend, FakeNvml)
            fake = agent.gpu.backend

            async def metrics() -> str:
                return await trio.to_thread.run_sync(get, base + "/metrics")

            async def metrics_with(*needles: str, without: tuple[str, ...] = ()) -> str:
                async def ok() -> str | None:
                    m = await metrics()
                    return m if all(n in m for n in needles) and not any(n in m for n in without) else None

                result: str = await wait_for(ok, f"/metrics with {needles} without {without}")
                return result

            async def failures_at_least(reason: str, n: int) -> None:
                async def ok() -> bool:
                    found = re.search(
                        rf'^nodevitals_podresources_failures_total{{reason="{reason}"}} (\S+)$', await metrics(), re.M
                    )
                    return found is not None and float(found[1]) >= n

                await wait_for(ok, f"{n} {reason} failures")

            # ---- labels: a whole GPU, a time-sliced one shared by two containers, one by index, a MIG slice
            m = await metrics_with('pod="train"', "nodevitals_podresources_up 1.0")
            (line,) = series(m, "DCGM_FI_DEV_GPU_TEMP", 0)
            assert line.endswith(
                'DCGM_FI_DRIVER_VERSION="550.90.07"' + POD_LABELS.format(c="main", ns="ml", p="train") + " 41"
            )
            (line,) = series(m, "DCGM_FI_DEV_XID_ERRORS", 0)  # attributes in name order, as dcgm-exporter sorts them
            assert line.endswith(
                'DCGM_FI_DRIVER_VERSION="550.90.07",container="main",err_code="0",err_msg="No Error",'
                'namespace="ml",pod="train"} 0'
            )
            (line,) = series(m, "DCGM_FI_DEV_GPU_TEMP", 1)  # one series, the holder listed last
            assert POD_LABELS.format(c="worker", ns="ml", p="shared-b") in line
            assert POD_LABELS.format(c="main", ns="batch", p="by-index") in series(m, "DCGM_FI_DEV_GPU_TEMP", 2)[0]
            golden_text = GOLDEN.read_text()
            golden = set(golden_text.splitlines())
            for gpu in (3, 4, 5, 6, 7):  # unallocated (and the MIG parent): byte-identical to the surface without pods
                for family in re.findall(r"^# TYPE (DCGM_\S+) ", m, re.M):
                    if family == "DCGM_FI_DEV_XID_ERRORS":  # the golden file has an XID on GPU 3
                        continue
                    (line,) = series(m, family, gpu)
                    if family == ENERGY:  # the golden file is tick 0; the replay adds perTick each tick since
                        (want,) = series(golden_text, family, gpu)
                        head, value = line.rsplit(" ", 1)
                        assert head == want.rsplit(" ", 1)[0], line
                        ticks, rest = divmod(int(value) - int(want.rsplit(" ", 1)[1]), ENERGY_PER_TICK)
                        assert ticks >= 0 and rest == 0, line
                    else:
                        assert line in golden, line
            promtool(m)

            async def attribution_status() -> dict[str, Any] | None:
                state = json.loads(await trio.to_thread.run_sync(get, base + "/v1/status"))
                detail = state["tiers"]["gpu"]["collectors"]["nvml"].get("detail", {})
                found: dict[str, Any] | None = detail.get("podAttribution")
                return found if found and found["up"] else None

            status = await wait_for(attribution_status, "pod attribution in /v1/status")
            assert status["holders"]["gpu7"] == [{"namespace": "mig", "pod": "slice", "container": "main"}]

            # ---- an XID on the shared GPU names both holders: webhook (verified) and nvdaemon tail
            out = io.StringIO()
            tail = Tail(Options(url=base, replay=10), out, io.StringIO())  # replayed if it connects after the XID
            tail_scope = trio.CancelScope()

            async def run_tail() -> None:
                with tail_scope:
                    await tail.run()

            nursery.start_soon(run_tail)
            fake.inject_xid(1, 79)
            (xid,) = await wait_for(lambda: events("gpu_xid_error"), "the XID on the webhook")
            assert xid["device"] == "gpu1" and xid["detail"]["pods"] == [
                {"namespace": "ml", "pod": "shared-a", "container": "worker"},
                {"namespace": "ml", "pod": "shared-b", "container": "worker"},
            ]
            await wait_for(lambda: "pods=ml/shared-a/worker,ml/shared-b/worker" in out.getvalue(), "the tail line")
            tail_scope.cancel()

            # ---- a rule on GPU 0: the ENTER names its holder; the EXIT names it too, after the pod left
            fake.set_reading(0, "temperature_gpu", 70)
            (enter,) = await wait_for(lambda: events("gpu_hot"), "gpu_hot ENTER")
            train = [{"namespace": "ml", "pod": "train", "container": "main"}]
            assert enter["phase"] == "ENTER" and enter["detail"]["pods"] == train
            engine_file = tmp_path / "state" / "engine.json"
            await wait_for(lambda: engine_file.exists() and '"pods":[{' in engine_file.read_text(), "pods persisted")
            kubelet.set_pods(SHARED_A, SHARED_B, BY_INDEX, MIG_SLICE, LATE)  # train went, late came
            m = await metrics_with('pod="late"', without=('pod="train"',))
            assert "container=" not in series(m, "DCGM_FI_DEV_GPU_TEMP", 0)[0]
            fake.set_reading(0, "temperature_gpu", 41)
            await wait_for(lambda: len(events("gpu_hot")) == 2, "gpu_hot EXIT")
            assert events("gpu_hot")[1]["phase"] == "EXIT" and events("gpu_hot")[1]["detail"]["pods"] == train

            # ---- garbage: attribution off (labels gone, events without pods), counted, logged once
            kubelet.set_mode("garbage")
            m = await metrics_with("nodevitals_podresources_up 0.0", without=('pod="late"',))
            await failures_at_least("garbage", 3)
            fake.inject_xid(0, 13)
            await wait_for(lambda: len(events("gpu_xid_error")) == 2, "second XID")
            assert "pods" not in events("gpu_xid_error")[1]["detail"]
            kubelet.set_mode("ok")
            await metrics_with('pod="late"', "nodevitals_podresources_up 1.0")

            # ---- a kubelet that hangs past the call timeout, then one that disappears and comes back
            kubelet.set_mode("hang")
            await metrics_with("nodevitals_podresources_up 0.0", without=('pod="late"',))
            await failures_at_least("timeout", 2)
            kubelet.set_mode("ok")
            await metrics_with('pod="late"')
            kubelet.stop()
            await failures_at_least("missing", 2)
            await metrics_with("nodevitals_podresources_up 0.0", without=('pod="late"',))
            kubelet = TestKubelet(sock).start()
            kubelet.set_pods(LATE)
            m = await metrics_with('pod="late"', "nodevitals_podresources_up 1.0", without=('pod="shared-b"',))
            promtool(m)
            agent.stopping.set()
    finally:
        kubelet.stop()
        rx.stop()
    offs = [r.getMessage() for r in caplog.records if "pod attribution off" in r.getMessage()]
    reasons = [o.split("pod-resources ")[1].split(":")[0] for o in offs]
    # Once per new reason, not per failing tick (3 garbage and 2 timeout ticks above); a kubelet going away may be
    # "refused" for a moment before its socket is gone.
    assert reasons.count("garbage") == 1 and reasons.count("timeout") == 1, reasons
    assert reasons[:2] == ["garbage", "timeout"] and reasons[-1] == "missing", reasons


def promtool(text: str) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus); make test installs it as root")
    check = subprocess.run([tool, "check", "metrics"], input=text.encode(), capture_output=True, check=False)
    findings = [line for line in (check.stdout + check.stderr).decode().splitlines() if line.strip()]
    assert check.returncode in (0, 3), findings  # 3: lint findings only, the exposition parsed
    assert [f for f in findings if not any(p.match(f) for p in INHERENT)] == []
