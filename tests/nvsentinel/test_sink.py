"""The sink inside the agent: XID events from the bus reach the platform-connector; /metrics follows; what is and is
not retried (connection reset, broken pipe)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import grpc
import trio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.model import Event, Phase
from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.sinks.nvsentinel import NvsentinelHealthSink, classify
from nvdaemon.supervise import Supervisor
from tests.nvsentinel.conftest import MakeReconciler
from tests.nvsentinel.connector import FakeConnector
from tests.nvsentinel.test_reconciler import HOT, active, sync
from tests.polling import until

wait_until = functools.partial(until, timeout=10.0)


async def test_xid_events_from_the_bus_raise_the_gpu_condition(
    tmp_path: Path, connector: FakeConnector, socket_path: Path, token_file: Path
) -> None:
    connector.node = "gpu-node"
    connector.start()
    text = (
        f"node: gpu-node\ntiers: [gpu]\nstateDir: {tmp_path / 'state'}\nprocRoot: {tmp_path / 'proc'}\n"
        f"sinks:\n  nvsentinel: {{enabled: true, socketPath: {socket_path}, tokenPath: {token_file}}}\n"
    )
    agent = Agent(parse_config(text, "t.yaml", env={}))
    cache = MetricsCache(agent)
    async with trio.open_nursery() as nursery:
        agent.supervisor = Supervisor(nursery)
        await agent.sync_sinks()
        sink = agent.sinks["nvsentinel"]
        assert isinstance(sink, NvsentinelHealthSink)
        # The XID and lost-GPU checks get their baselines (the gpu tier is configured with xid: true).
        await wait_until(lambda: connector.condition("NvdaemonGpuXidError") is not None)
        await wait_until(lambda: connector.condition("NvdaemonGpuFallenOff") is not None)
        before = cache.render()
        agent.bus.publish(
            Event(
                "id-1",
                "gpu-node",
                "gpu",
                "gpu0",
                "gpu_xid_error",
                Phase.ENTER,
                "critical",
                1,
                1.0,
                detail={
                    "xid": 48,
                    "description": "double bit ECC error",
                    "pci_bus_id": "0000:3b:00.0",
                    "gpu_uuid": "GPU-aa",
                },
            )
        )
        await wait_until(lambda: (connector.condition("NvdaemonGpuXidError") or {}).get("status") == "True")
        fault = connector.ok_events()[-1]
        assert fault.recommendedAction == pb.COMPONENT_RESET and fault.isFatal and list(fault.errorCode) == ["48"]
        assert fault.componentClass == "GPU"
        await wait_until(lambda: b'sends_success_total{monitor="nvdaemon"} 3.0' in cache.render())
        assert cache.render() != before
        nursery.cancel_scope.cancel()


class FakeCall(grpc.RpcError, grpc.Call):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> Any:
        return ()

    def trailing_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


def test_only_unavailable_deadline_reset_and_broken_pipe_are_retried() -> None:
    retried = [
        FakeCall(grpc.StatusCode.UNAVAILABLE, "failed to connect"),
        FakeCall(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
        FakeCall(grpc.StatusCode.INTERNAL, "recvmsg: Connection reset by peer"),
        FakeCall(grpc.StatusCode.UNKNOWN, "sendmsg: Broken pipe"),
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenPipeError(32, "Broken pipe"),
    ]
    assert all(classify(e).retryable for e in retried)
    permanent = [
        FakeCall(grpc.StatusCode.UNAUTHENTICATED, ""),
        FakeCall(grpc.StatusCode.PERMISSION_DENIED, ""),
        FakeCall(grpc.StatusCode.INVALID_ARGUMENT, ""),
        FakeCall(grpc.StatusCode.UNIMPLEMENTED, ""),
        FakeCall(grpc.StatusCode.INTERNAL, "boom"),
        PermissionError(13, "Permission denied"),
    ]
    assert not any(classify(e).retryable for e in permanent)
    assert classify(permanent[0]).code == "UNAUTHENTICATED"


async def test_connection_reset_then_ok_is_retried(make_reconciler: MakeReconciler) -> None:
    sent: list[pb.HealthEvents] = []
    failures: list[BaseException] = [ConnectionResetError(104, "reset"), BrokenPipeError(32, "pipe")]

    class Flaky:
        def send(self, request: pb.HealthEvents) -> None:
            sent.append(request)
            if failures:
                raise failures.pop(0)

    rec = make_reconciler(healthy_baseline=False)
    rec.publisher = Flaky()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    assert len(sent) == 3 and rec.success == 1
    assert rec.errors == {"CONNECTION_RESET": 1, "BROKEN_PIPE": 1}
