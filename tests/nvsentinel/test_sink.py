"""The sink inside the agent: XID events from the bus reach the platform-connector; /metrics follows; what is and is
not retried (connection reset, broken pipe)."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import trio

from nvdaemon.app import Agent
from nvdaemon.configload import parse_config
from nvdaemon.model import Event, Phase
from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.server.metrics import MetricsCache
from nvdaemon.sinks.nvsentinel.map import CheckSpec
from nvdaemon.sinks.nvsentinel.sink import NvsentinelHealthSink, classify
from nvdaemon.sinks.nvsentinel.wire import RpcError
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


def test_only_unavailable_deadline_reset_and_broken_pipe_are_retried() -> None:
    retried = [
        RpcError("UNAVAILABLE", "failed to connect"),
        RpcError("DEADLINE_EXCEEDED", "Deadline Exceeded"),
        RpcError("INTERNAL", "recvmsg: Connection reset by peer"),
        RpcError("UNKNOWN", "sendmsg: Broken pipe"),
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenPipeError(32, "Broken pipe"),
    ]
    assert all(classify(e).retryable for e in retried)
    permanent = [
        RpcError("UNAUTHENTICATED", ""),
        RpcError("PERMISSION_DENIED", ""),
        RpcError("INVALID_ARGUMENT", ""),
        RpcError("UNIMPLEMENTED", ""),
        RpcError("INTERNAL", "boom"),
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


async def test_checks_are_derived_again_only_when_the_rules_change(
    tmp_path: Path, make_reconciler: MakeReconciler
) -> None:
    """Every reconcile needs the checks of the rules in force; they are derived once per set of rules (a reload
    brings a new one), not on every tick, and a new set of rules brings its checks."""
    text = (
        f"node: n1\ntiers: [core, gpu]\nstateDir: {tmp_path / 'state'}\n"
        "rules:\n  - {condition: load_high, metric: load_avg_1m, op: '>', threshold: 9, severity: warning}\n"
    )
    agent = Agent(parse_config(text, "t.yaml", env={}))
    rules = [agent.loaded.config.rules]
    rec = make_reconciler(healthy_baseline=False)
    derived: list[list[str]] = []
    real_checks = rec.checks

    def counting(*args: Any, **kwargs: Any) -> list[CheckSpec]:
        out = real_checks(*args, **kwargs)
        derived.append(sorted(c.check_name for c in out))
        return out

    rec.checks = counting  # type: ignore[method-assign]
    sink = NvsentinelHealthSink(dataclasses.replace(agent.sink_context(), rules=lambda: rules[0]), reconciler=rec)
    await trio.to_thread.run_sync(rec.load)
    for _ in range(3):
        await sink.tick()
    assert derived == [["NvdaemonGpuFallenOff", "NvdaemonGpuXidError", "NvdaemonLoadHigh"]]
    reloaded = parse_config(text.replace("load_high", "load_very_high"), "t.yaml", env={})
    rules[0] = reloaded.config.rules
    await sink.tick()
    await sink.tick()
    assert derived[1:] == [["NvdaemonGpuFallenOff", "NvdaemonGpuXidError", "NvdaemonLoadVeryHigh"]]
