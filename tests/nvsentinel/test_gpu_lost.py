"""A GPU that falls off the bus, and NVML that stops answering, reach the test platform-connector as the fatal
RESTART_BM check NvdaemonGpuFallenOff; the fault clears only when that GPU answers again, across restarts of the
reconciler on the same stateDir; a socket path whose stat fails other than "not found" leads to an attempted send.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from nvdaemon.app import Agent
from nvdaemon.configload import load_config, parse_config
from nvdaemon.model import Event, Phase
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.sinks.nvsentinel.sink import Reconciler
from tests.nvsentinel.conftest import MakeReconciler
from tests.nvsentinel.connector import FakeConnector
from tests.polling import until
from tests.test_e2e import ROOT

CHECK = "NvdaemonGpuFallenOff"
UUID5 = "GPU-5a8b9d76-c2a7-4e5f-8b6d-0f1a2b3c4d56"
PCI5 = "00000000:AB:00.0"
LOST_NO_XID = ROOT / "fixtures" / "nvml" / "h100-8gpu-gpu5-lost-no-xid.json"
HEALTHY = ROOT / "fixtures" / "nvml" / "h100-8gpu-healthy.json"


def lost_event(phase: Phase = Phase.ENTER, device: str = "gpu5", uuid: str = UUID5, pci: str = PCI5) -> Event:
    detail: dict[str, object] = {"gpu_uuid": uuid, "pci_bus_id": pci, "error": f"{device}: GPU is lost"}
    return Event("l1", "node-a", "gpu", device, "gpu_lost", phase, "critical", 1, 1.0, detail=detail)


async def sync(rec: Reconciler) -> None:
    await rec.reconcile(rec.desired([], {}), rec.checks([], xid_enabled=True, gpu_enabled=True))


def status(connector: FakeConnector) -> str | None:
    cond = connector.condition(CHECK)
    return cond["status"] if cond else None


def faults(connector: FakeConnector) -> list[pb.HealthEvent]:
    return [e for e in connector.ok_events() if e.checkName == CHECK and not e.isHealthy]


def entities(ev: pb.HealthEvent) -> set[tuple[str, str]]:
    return {(e.entityType, e.entityValue) for e in ev.entitiesImpacted}


# ---- the reconciler -------------------------------------------------------------------------------------------------
async def test_lost_gpu_is_a_fatal_restart_bm_condition_until_it_answers(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec)
    assert status(connector) == "False"  # the baseline of the configured check
    rec.note_event(lost_event())
    await sync(rec)
    cond = connector.condition(CHECK)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == f"{CHECK}IsNotHealthy"
    assert "Recommended Action=RESTART_BM;" in cond["message"] and "ErrorCode:GPU_FALLEN_OFF_BUS" in cond["message"]
    (fault,) = faults(connector)
    assert fault.isFatal and fault.componentClass == "GPU" and fault.recommendedAction == pb.RESTART_BM
    assert list(fault.errorCode) == ["GPU_FALLEN_OFF_BUS"]
    assert entities(fault) == {("GPU", "5"), ("GPU_UUID", UUID5), ("PCI", PCI5)}
    assert rec.state()["lostGpus"][0]["uuid"] == UUID5

    rec.note_event(lost_event(Phase.EXIT))
    await sync(rec)
    assert status(connector) == "False"
    clear = connector.ok_events()[-1]
    assert clear.isHealthy and entities(clear) == entities(fault) and list(clear.errorCode) == ["GPU_FALLEN_OFF_BUS"]
    assert rec.state()["lostGpus"] == [] and rec.pending == 0


async def test_restart_neither_reraises_the_lost_gpu_nor_loses_its_clear(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    first = make_reconciler()
    await trio.to_thread.run_sync(first.load)
    first.note_event(lost_event())
    await sync(first)
    assert status(connector) == "True"
    sent = len(connector.ok_events())

    # Restart with the GPU still lost: before the gpu tier's first tick, then with its ENTER again.
    second = make_reconciler()
    await trio.to_thread.run_sync(second.load)
    await sync(second)
    second.note_event(lost_event())
    second.gpus_answering([("gpu4", "GPU-4f7a8c65-b196-4d4e-9a5c-9e0f1a2b3c45", "00000000:9A:00.0")])  # another GPU
    await sync(second)
    assert len(connector.ok_events()) == sent and status(connector) == "True"

    # The GPU answers while the platform-connector is away: the clear cannot be delivered yet.
    connector.stop()
    second.note_event(lost_event(Phase.EXIT))
    await sync(second)
    assert second.skipped >= 1 and second.pending == 1

    # Restart: the clear is still owed and goes out once the platform-connector is back.
    connector.start()
    third = make_reconciler()
    await trio.to_thread.run_sync(third.load)
    await sync(third)
    assert status(connector) == "False" and third.pending == 0
    assert connector.ok_events()[-1].isHealthy


async def test_a_gpu_that_answers_after_a_restart_clears_the_fault_raised_before_it(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    first = make_reconciler()
    await trio.to_thread.run_sync(first.load)
    first.note_event(lost_event())
    await sync(first)
    assert status(connector) == "True"

    # After a reboot the GPU is back, at another index: no EXIT (the new process never saw it lost), but it answers.
    second = make_reconciler()
    await trio.to_thread.run_sync(second.load)
    second.gpus_answering([("gpu4", UUID5, PCI5)])
    await sync(second)
    assert status(connector) == "False"
    assert json.loads(second.state_path.read_bytes())["lost"] == []


# ---- the socket check -----------------------------------------------------------------------------------------------
async def test_a_socket_path_under_a_file_is_tried_not_skipped(tmp_path: Path, make_reconciler: MakeReconciler) -> None:
    """ENOTDIR from stat (the path runs through a regular file): not "not found", so the call is attempted, and
    fails the way a call fails (UNAVAILABLE, retried), never as a skipped send."""
    (tmp_path / "file").write_text("")
    rec = make_reconciler(socket_path=str(tmp_path / "file" / "pc.sock"), max_attempts=2, retry_initial_seconds=0.01)
    await trio.to_thread.run_sync(rec.load)
    rec.note_event(lost_event())
    await sync(rec)
    assert rec.skipped == 0 and rec.socket_present is True
    assert rec.errors == {"UNAVAILABLE": 2}  # the baselines stop at the first failure: one send, two attempts
    assert rec.pending == 3 and rec.reported == {}


CHILD = """
import json, sys, trio
from pathlib import Path
from nvdaemon.config import NvsentinelSink
from nvdaemon.sinks.nvsentinel.sink import Reconciler
sock, state = sys.argv[1], Path(sys.argv[2])
rec = Reconciler(NvsentinelSink(enabled=True, socket_path=sock, token_path="", max_attempts=1), node="n",
                 state_path=state / "nvsentinel.json", boot_id_path=None)
async def main():
    await rec.reconcile(rec.desired([], {}), rec.checks([], xid_enabled=True))
trio.run(main)
print(json.dumps({"skipped": rec.skipped, "errors": dict(rec.errors), "present": rec.socket_present}))
"""


@pytest.fixture
def locked_dir() -> Iterator[Path]:
    """A directory a non-root user can reach, holding a directory with mode 000 (outside pytest's 0700 tmp)."""
    top = Path(tempfile.mkdtemp(prefix="nvs-perm-"))
    try:
        top.chmod(0o755)
        (top / "locked").mkdir(mode=0o000)
        (top / "locked").chmod(0o000)
        (top / "state").mkdir(mode=0o777)
        (top / "state").chmod(0o777)
        yield top
    finally:
        (top / "locked").chmod(0o755)
        shutil.rmtree(top)


def test_a_permission_error_on_the_socket_path_leads_to_an_attempted_send(locked_dir: Path) -> None:
    """EACCES from stat (a parent directory with mode 000). Root bypasses directory permissions, so the reconciler
    runs in a child process as uid/gid 65534 (``setpriv``) when the tests run as root."""
    cmd = [sys.executable, "-c", CHILD, str(locked_dir / "locked" / "pc.sock"), str(locked_dir / "state")]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make stat fail with EACCES")
        cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=locked_dir, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert result["skipped"] == 0 and result["present"] is True
    assert result["errors"] == {"UNAVAILABLE": 1}  # the call was made: gRPC's answer, not stat's


# ---- the agent: the gpu tier on the fake NVML, the sink, the test platform-connector ------------------------------
def gpu_agent(tmp_path: Path, socket_path: Path, token_file: Path, scenario: Path) -> Agent:
    text = (
        f"node: node-a\ntiers: [gpu]\nintervalSeconds: 0.05\nstateDir: {tmp_path / 'state'}\n"
        f"procRoot: {tmp_path / 'proc'}\ngpu: {{backend: fake, fakeScenario: '{scenario}'}}\n"
        f"sinks:\n  metrics: {{listenAddr: '127.0.0.1:0'}}\n  stream: {{enabled: false}}\n"
        f"  nvsentinel: {{enabled: true, socketPath: {socket_path}, tokenPath: {token_file}}}\n"
    )
    return Agent(parse_config(text, "t.yaml", env={}))


wait_until = functools.partial(until, timeout=15.0)


async def test_a_lost_gpu_without_an_xid_turns_the_condition_true_and_false_when_it_answers(
    tmp_path: Path, connector: FakeConnector, socket_path: Path, token_file: Path
) -> None:
    connector.start()
    agent = gpu_agent(tmp_path, socket_path, token_file, LOST_NO_XID)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        await wait_until(lambda: status(connector) == "True")
        (fault,) = faults(connector)
        assert entities(fault) == {("GPU", "5"), ("GPU_UUID", UUID5), ("PCI", PCI5)}
        assert fault.recommendedAction == pb.RESTART_BM and fault.isFatal
        assert not [e for e in connector.ok_events() if e.checkName == "NvdaemonGpuXidError" and not e.isHealthy]
        assert agent.gpu is not None and isinstance(agent.gpu.backend, FakeNvml)
        agent.gpu.backend.set_lost(5, False)  # a driver reload: the GPU answers again
        await wait_until(lambda: status(connector) == "False")
        agent.stopping.set()
    assert len(faults(connector)) == 1


async def test_nvml_that_stops_answering_reports_every_gpu_lost_until_each_answers(
    tmp_path: Path, connector: FakeConnector, socket_path: Path, token_file: Path
) -> None:
    connector.start()
    agent = gpu_agent(tmp_path, socket_path, token_file, HEALTHY)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        await wait_until(lambda: status(connector) == "False")  # the baseline
        assert agent.gpu is not None and isinstance(agent.gpu.backend, FakeNvml)
        fake = agent.gpu.backend
        fake.fail("Unknown Error")
        await wait_until(lambda: len(faults(connector)) == 8)
        assert status(connector) == "True" and len(connector.conditions[CHECK].entries) == 8  # one per GPU
        gpus = {dict((e.entityType, e.entityValue) for e in f.entitiesImpacted)["GPU"] for f in faults(connector)}
        assert gpus == {str(i) for i in range(8)}
        assert all("Unknown Error" in f.message for f in faults(connector))
        fake.set_lost(5, True)  # NVML comes back, but one GPU stays lost
        fake.fail("")
        await wait_until(lambda: len([e for e in connector.ok_events() if e.checkName == CHECK and e.isHealthy]) == 8)
        cond = connector.condition(CHECK)
        assert cond is not None and cond["status"] == "True" and cond["message"].count("RESTART_BM;") == 1
        assert f"GPU_UUID:{UUID5}" in cond["message"]
        fake.set_lost(5, False)
        await wait_until(lambda: status(connector) == "False")
        agent.stopping.set()


async def test_a_gpu_lost_before_a_reload_enables_the_sink_is_reported(
    tmp_path: Path, connector: FakeConnector, socket_path: Path, token_file: Path
) -> None:
    """The gpu_lost ENTER went out while no NVSentinel sink was subscribed; the sink a reload starts reports the GPU
    that is still lost (from the gpu tier's list of GPUs lost now), and clears it when the GPU answers."""
    connector.start()
    config = tmp_path / "config.yaml"

    def write(enabled: bool) -> None:
        config.write_text(
            f"node: node-a\ntiers: [gpu]\nintervalSeconds: 0.05\nstateDir: {tmp_path / 'state'}\n"
            f"procRoot: {tmp_path / 'proc'}\ngpu: {{backend: fake, fakeScenario: '{LOST_NO_XID}'}}\n"
            f"sinks:\n  metrics: {{listenAddr: '127.0.0.1:0'}}\n  stream: {{enabled: false}}\n"
            f"  nvsentinel: {{enabled: {str(enabled).lower()}, socketPath: {socket_path}, tokenPath: {token_file}}}\n"
        )

    write(False)
    agent = Agent(load_config(str(config), env={}), config_path=str(config))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run)
        await wait_until(lambda: agent.gpu is not None and 5 in agent.gpu.lost)
        assert connector.ok_events() == []
        write(True)
        await agent.reload()
        assert "nvsentinel" in agent.sinks
        await wait_until(lambda: status(connector) == "True")
        (fault,) = faults(connector)
        assert entities(fault) == {("GPU", "5"), ("GPU_UUID", UUID5), ("PCI", PCI5)}
        assert agent.gpu is not None and isinstance(agent.gpu.backend, FakeNvml)
        agent.gpu.backend.set_lost(5, False)
        await wait_until(lambda: status(connector) == "False")
        agent.stopping.set()
    assert len(faults(connector)) == 1
