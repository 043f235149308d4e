"""SIGHUP's reload turns pod attribution off and on: the refresh task stops (labels gone at once) or starts, and a
changed socket path restarts it."""

from __future__ import annotations

from pathlib import Path

import trio

from nvdaemon.app import Agent
from nvdaemon.configload import load_config
from nvdaemon.gpu.podresources import TASK_NAME
from nvdaemon.nvml.fake import FakeNvml
from tests.gpu.conftest import HEALTHY, dcgm_text, wait_until
from tests.podres.kubelet import TestKubelet, pod

UUID0 = "GPU-0b3c4e21-7d52-4f0a-9c1e-5a6b7c8d9e01"

CONFIG = """
node: gpu-node
stateDir: {state}
intervalSeconds: 0.05
tiers: [gpu]
gpu: {{backend: fake, fakeScenario: '{scenario}'}}
sinks: {{metrics: {{listenAddr: '127.0.0.1:0'}}, stream: {{enabled: false}}}}
dcgmCompat: {{enabled: true, podAttribution: {on}, podResourcesSocket: '{socket}'}}
"""


async def test_reload_stops_starts_and_restarts_the_refresh(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"

    def write(on: bool, socket: Path) -> None:
        text = CONFIG.format(state=tmp_path / "state", scenario=HEALTHY, on=str(on).lower(), socket=socket)
        config.write_text(text)

    with TestKubelet(tmp_path / "a.sock") as a, TestKubelet(tmp_path / "b.sock") as b:
        a.set_pods(pod("ml", "from-a", ("main", [("nvidia.com/gpu", [UUID0])])))
        b.set_pods(pod("ml", "from-b", ("main", [("nvidia.com/gpu", [UUID0])])))
        write(True, a.socket_path)
        agent = Agent(load_config(str(config), env={}), config_path=str(config))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run)
            await wait_until(lambda: b'pod="from-a"' in dcgm_text(agent))
            sup = agent.supervisor
            assert sup is not None and TASK_NAME in sup.tasks

            write(False, a.socket_path)
            await agent.reload()
            assert TASK_NAME not in sup.tasks
            assert agent.gpu is not None and agent.gpu.pod_attribution is None
            assert b'pod="' not in dcgm_text(agent)

            write(True, b.socket_path)
            await agent.reload()
            await wait_until(lambda: b'pod="from-b"' in dcgm_text(agent))
            calls_a = a.calls["List"]
            write(True, a.socket_path)  # only the path changed: restarted on the new one
            await agent.reload()
            await wait_until(lambda: b'pod="from-a"' in dcgm_text(agent))
            assert a.calls["List"] > calls_a
            agent.stopping.set()


async def test_a_hanging_kubelet_never_holds_up_the_gpu_tier(tmp_path: Path) -> None:
    """The kubelet accepts List and never answers, with a deadline far longer than the test: the gpu tier keeps
    ticking (the fake NVML advances one step per tick) and its events keep flowing, while the one call is stuck."""
    config = tmp_path / "config.yaml"
    text = CONFIG.format(state=tmp_path / "state", scenario=HEALTHY, on="true", socket=tmp_path / "k.sock")
    config.write_text(text.replace("podResourcesSocket:", "podResourcesTimeoutSeconds: 600, podResourcesSocket:"))
    with TestKubelet(tmp_path / "k.sock") as kubelet:
        kubelet.set_mode("hang")
        agent = Agent(load_config(str(config), env={}), config_path=str(config))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run)
            await wait_until(lambda: kubelet.calls["List"] >= 1)
            assert agent.gpu is not None and isinstance(agent.gpu.backend, FakeNvml)
            fake = agent.gpu.backend
            start = fake.tick
            await wait_until(lambda: fake.tick >= start + 20)  # 20 ticks of 0.05 s, the List still unanswered
            fake.set_lost(3, True)
            await wait_until(lambda: 3 in agent.gpu.lost if agent.gpu is not None else False)
            assert kubelet.calls["List"] == 1 and agent.gpu.pod_attribution is not None
            assert not agent.gpu.pod_attribution.up
            agent.stopping.set()
