"""The reconciler against a real gRPC platform-connector on a Unix socket (tests/nvsentinel/connector.py).

Assertions are on what an operator would see on the node (conditions, Events), on the reconciler's counters, and on
what is persisted; real threads and sockets, so real time (retry delays are shortened through the settings).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

import grpc
import msgspec
import pytest
import trio

from nvdaemon.config import Rule, RuleNvsentinel
from nvdaemon.engine import ActiveCondition, rule_key
from nvdaemon.exposition import render
from nvdaemon.model import Event, Phase
from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.sinks.nvsentinel.sink import Reconciler
from tests.nvsentinel.conftest import TOKEN, MakeReconciler
from tests.nvsentinel.connector import FakeConnector

HOT = Rule(
    metric="temp_celsius",
    device="hwmon0/coretemp/temp1",
    condition="cpu_package_hot",
    severity="critical",
    threshold=95,
)
LOAD = Rule(metric="load1", device="cpu", condition="load_high", threshold=16)
HOT_CHECK = "NvdaemonCpuPackageHot"
LOAD_CHECK = "NvdaemonLoadHigh"


def active(rule: Rule, value: float, device: str | None = None) -> ActiveCondition:
    return ActiveCondition(
        rule_key=rule_key(rule),
        metric=rule.metric,
        device=device or rule.device,
        labels=(),
        condition=rule.condition,
        severity=rule.severity,
        tier="core",
        threshold=rule.threshold,
        started_at=1.0,
        enter_id="e",
        value=value,
        last_seen=1.0,
    )


async def sync(
    rec: Reconciler, conds: Iterable[ActiveCondition] = (), rules: Iterable[Rule] = (HOT, LOAD), xid: bool = False
) -> None:
    rules = list(rules)
    desired = rec.desired(conds, {rule_key(r): r for r in rules})
    await rec.reconcile(desired, rec.checks(rules, xid))


def xid_event(xid: int, pci: str = "0000:3b:00.0", uuid: str = "GPU-1234") -> Event:
    detail: dict[str, object] = {"xid": xid, "description": "from the driver", "pci_bus_id": pci, "gpu_uuid": uuid}
    return Event("x1", "node-a", "gpu", "gpu0", "gpu_xid_error", Phase.ENTER, "critical", 1, 1.0, detail=detail)


def persisted(rec: Reconciler) -> dict[str, object]:
    doc: dict[str, object] = json.loads(rec.state_path.read_bytes())
    return doc


async def test_fault_raises_condition_and_clear_flips_it(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    cond = connector.condition(HOT_CHECK)
    assert cond is not None
    assert cond["status"] == "True" and cond["reason"] == f"{HOT_CHECK}IsNotHealthy"
    assert "Recommended Action=CONTACT_SUPPORT;" in cond["message"]
    assert "temp_celsius on hwmon0/coretemp/temp1 is 97, threshold > 95" in cond["message"]
    # Every configured check got its healthy baseline first (a non-fatal one too), then the fault.
    kinds = [(e.checkName, e.isHealthy) for e in connector.ok_events()]
    assert kinds == [(HOT_CHECK, True), (LOAD_CHECK, True), (HOT_CHECK, False)]
    fault = connector.ok_events()[-1]
    assert fault.isFatal and fault.componentClass == "CPU" and list(fault.errorCode) == ["cpu_package_hot"]
    assert fault.nodeName == "node-a" and fault.agent == "nvdaemon" and fault.version == 1

    # Nothing changed: nothing is sent again, whatever the value does.
    await sync(rec, [active(HOT, 99.0)])
    assert len(connector.ok_events()) == 3
    assert rec.pending == 0 and rec.success == 3

    await sync(rec, [])
    cond = connector.condition(HOT_CHECK)
    assert cond == {
        "type": HOT_CHECK,
        "status": "False",
        "reason": f"{HOT_CHECK}IsHealthy",
        "message": "No Health Failures",
    }
    clear = connector.ok_events()[-1]
    assert clear.isHealthy and list(clear.errorCode) == ["cpu_package_hot"]
    assert clear.processingStrategy == fault.processingStrategy == pb.EXECUTE_REMEDIATION
    assert persisted(rec)["reported"] == []


async def test_non_fatal_fault_becomes_an_event_not_a_condition(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(LOAD, 24.51)])
    (event,) = connector.events_for(LOAD_CHECK)
    assert "load1 on cpu is 24.51, threshold > 16" in event["message"]
    cond = connector.condition(LOAD_CHECK)
    assert cond is not None and cond["status"] == "False"  # the baseline's; the fault did not flip it


async def test_socket_absent_skips_without_advancing_then_publishes_with_fresh_timestamps(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    assert rec.skipped == 3 and rec.success == 0 and sum(rec.errors.values()) == 0
    assert rec.pending == 3 and rec.reported == {} and rec.baselined == set()
    assert rec.state()["socketPresent"] is False
    assert persisted(rec)["reported"] == []  # only the boot id was written
    skipped = _metric(rec, "nvsentinel_health_events_publisher_skipped_pc_unavailable_total", monitor="nvdaemon")
    assert skipped == 3.0

    await trio.sleep(0.01)
    connector.start()
    before = time.time()
    await sync(rec, [active(HOT, 97.0)])
    events = connector.ok_events()
    assert [e.isHealthy for e in events] == [True, True, False]
    assert all(e.generatedTimestamp.ToNanoseconds() >= before * 1e9 for e in events)
    assert rec.pending == 0 and rec.skipped == 3


async def test_server_dies_mid_retry_then_comes_back(
    connector: FakeConnector, make_reconciler: MakeReconciler, socket_path: Path
) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False)
    await trio.to_thread.run_sync(rec.load)

    def die() -> grpc.StatusCode:
        socket_path.unlink()  # the platform-connector goes away while answering
        return grpc.StatusCode.UNAVAILABLE

    connector.script.append(die)
    await sync(rec, [active(HOT, 97.0)])
    connector.stop()
    assert [c.code for c in connector.calls()] == ["UNAVAILABLE"]
    assert rec.errors == {"UNAVAILABLE": 1} and rec.skipped == 1  # the retry found no socket: no more attempts
    assert rec.reported == {} and rec.pending == 1
    first = connector.calls()[0].event.generatedTimestamp.ToNanoseconds()

    back = FakeConnector(socket_path, "node-a", connector.token_file).start()
    try:
        await sync(rec, [active(HOT, 97.0)])
        (event,) = back.ok_events()
        assert not event.isHealthy and event.generatedTimestamp.ToNanoseconds() > first
        assert back.condition(HOT_CHECK) is not None
        assert rec.pending == 0
    finally:
        back.stop()


async def test_unavailable_twice_then_ok_is_retried_with_backoff(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False, retry_initial_seconds=0.2, retry_multiplier=1.5)
    await trio.to_thread.run_sync(rec.load)
    connector.script.extend([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE])
    began = trio.current_time()
    await sync(rec, [active(HOT, 97.0)])
    took = trio.current_time() - began
    calls = connector.calls()
    assert [c.code for c in calls] == ["UNAVAILABLE", "UNAVAILABLE", "OK"]
    assert len({c.event.id for c in calls}) == 1  # one event, retried
    assert took >= 0.2 + 0.3
    assert rec.errors == {"UNAVAILABLE": 2} and rec.success == 1
    assert _metric(rec, "nvsentinel_health_events_publisher_sends_error_total", code="UNAVAILABLE") == 2.0
    assert _metric(rec, "nvsentinel_health_events_publisher_sends_success_total") == 1.0
    cond = connector.condition(HOT_CHECK)
    assert cond is not None and cond["status"] == "True"


async def test_retries_stop_after_max_attempts(connector: FakeConnector, make_reconciler: MakeReconciler) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False, retry_initial_seconds=0.01, max_attempts=3)
    await trio.to_thread.run_sync(rec.load)
    connector.script.extend([grpc.StatusCode.UNAVAILABLE] * 5)
    await sync(rec, [active(HOT, 97.0), active(LOAD, 20.0)])
    assert len(connector.calls()) == 3  # the second difference is not tried once the connector keeps failing
    assert rec.reported == {} and rec.pending == 2


async def test_call_timeout_is_deadline_exceeded_and_retried(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False, call_timeout_seconds=0.3)
    await trio.to_thread.run_sync(rec.load)

    def slow() -> None:
        time.sleep(0.6)

    connector.script.append(slow)
    await sync(rec, [active(HOT, 97.0)])
    assert rec.errors == {"DEADLINE_EXCEEDED": 1}
    assert rec.success == 1 and rec.pending == 0


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT]
)
async def test_permanent_rejections_are_not_retried(
    connector: FakeConnector, make_reconciler: MakeReconciler, code: grpc.StatusCode
) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False)
    await trio.to_thread.run_sync(rec.load)
    connector.script.append(code)
    await sync(rec, [active(HOT, 97.0)])
    assert [c.code for c in connector.calls()] == [code.name]
    assert rec.errors == {code.name: 1} and rec.success == 0
    assert rec.reported == {} and rec.pending == 1
    assert connector.condition(HOT_CHECK) is None
    # The difference is still there: the next tick tries again.
    await sync(rec, [active(HOT, 97.0)])
    assert rec.success == 1 and rec.pending == 0


async def test_connector_rules_wrong_token_wrong_node_custom_without_text(
    connector: FakeConnector, make_reconciler: MakeReconciler, token_file: Path, tmp_path: Path
) -> None:
    connector.start()
    token_file.write_text("another-token")
    other = tmp_path / "other"
    other.write_text("not-the-token")
    rec = make_reconciler(healthy_baseline=False, token_path=str(other))
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    assert rec.errors == {"UNAUTHENTICATED": 1}

    rec = make_reconciler(healthy_baseline=False)
    rec.node = "node-b"
    await sync(rec, [active(HOT, 97.0)])
    assert rec.errors == {"PERMISSION_DENIED": 1}

    custom = Rule(
        metric="load1",
        device="cpu",
        condition="load_high",
        threshold=16,
        nvsentinel=RuleNvsentinel(fatal=True, recommended_action="CUSTOM"),
    )
    rec = make_reconciler(healthy_baseline=False)
    await sync(rec, [active(custom, 20.0)], rules=[custom])
    assert rec.errors == {"INVALID_ARGUMENT": 1}
    assert [c.code for c in connector.calls()] == ["UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT"]


async def test_token_file_is_reread_on_every_call(
    connector: FakeConnector, make_reconciler: MakeReconciler, token_file: Path
) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False)
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    # kubelet rotates a projected token by swapping the file: write the new one beside it and rename over.
    fresh = token_file.with_name("token.new")
    fresh.write_text("rotated-token-2")
    os.replace(fresh, token_file)
    await sync(rec, [active(HOT, 97.0), active(LOAD, 20.0)])
    auth = [c.metadata.get("authorization") for c in connector.calls()]
    assert auth == [f"Bearer {TOKEN}", "Bearer rotated-token-2"]
    assert rec.errors == {}


async def test_empty_token_path_sends_no_header(connector: FakeConnector, make_reconciler: MakeReconciler) -> None:
    connector.token_file = None
    connector.start()
    rec = make_reconciler(healthy_baseline=False, token_path="")
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    (call,) = connector.calls()
    assert call.code == "OK" and "authorization" not in call.metadata


@pytest.mark.parametrize(
    "content",
    [None, b"", b" \n", b"x" * 8193, "tök".encode()],
    ids=["missing", "empty", "blank", "oversized", "non-ascii"],
)
async def test_unusable_token_file_blocks_the_send(
    connector: FakeConnector, make_reconciler: MakeReconciler, token_file: Path, content: bytes | None
) -> None:
    connector.token_file = None  # this connector would accept anything: the agent must refuse on its own
    connector.start()
    if content is None:
        token_file.unlink()
    else:
        token_file.write_bytes(content)
    rec = make_reconciler(healthy_baseline=False)
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    assert connector.calls() == []
    assert rec.errors == {"TOKEN_ERROR": 1} and rec.reported == {} and rec.pending == 1
    assert rec.last_error is not None and str(token_file) in rec.last_error
    assert TOKEN not in rec.last_error


async def test_whitespace_around_the_token_is_not_part_of_it(
    connector: FakeConnector, make_reconciler: MakeReconciler, token_file: Path
) -> None:
    """The server's rule too (one reader, ``nvdaemon.token``): ``echo token > file`` leaves a newline no header
    can carry; a bearer token never holds whitespace, so only what is between is sent."""
    token_file.write_bytes(b" " + TOKEN.encode() + b"\r\n")
    connector.token_file = None  # accepts any header: the assertion is on what the agent sent
    connector.start()
    rec = make_reconciler(healthy_baseline=False)
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    (call,) = connector.calls()
    assert call.code == "OK" and call.metadata["authorization"] == f"Bearer {TOKEN}"
    assert rec.errors == {} and rec.pending == 0


async def test_restart_while_fault_active_sends_no_second_fault_and_delivers_the_clear(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    sent = len(connector.ok_events())

    again = make_reconciler()  # the agent restarted: same state file
    await trio.to_thread.run_sync(again.load)
    await sync(again, [active(HOT, 98.0)])
    assert len(connector.ok_events()) == sent  # neither the baselines nor the fault again
    await sync(again, [])
    clear = connector.ok_events()[-1]
    assert clear.isHealthy and clear.checkName == HOT_CHECK
    cond = connector.condition(HOT_CHECK)
    assert cond is not None and cond["status"] == "False"


async def test_clear_keeps_the_processing_strategy_of_its_fault(
    connector: FakeConnector, make_reconciler: MakeReconciler
) -> None:
    connector.start()
    rec = make_reconciler(processing_strategy="STORE_ONLY")
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [active(HOT, 97.0)])
    # The rollout leaves observe-only while the fault is active: its clear still carries STORE_ONLY.
    rec = make_reconciler(processing_strategy="EXECUTE_REMEDIATION")
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [])
    events = [e for e in connector.ok_events() if list(e.errorCode) == ["cpu_package_hot"]]
    assert [(e.isHealthy, e.processingStrategy) for e in events] == [(False, pb.STORE_ONLY), (True, pb.STORE_ONLY)]


async def test_healthy_baseline_off_sends_none(connector: FakeConnector, make_reconciler: MakeReconciler) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False)
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [])
    assert connector.calls() == []


async def test_xids_raise_until_a_reboot_clears_them(
    connector: FakeConnector, make_reconciler: MakeReconciler, boot_id: Path
) -> None:
    connector.start()
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    rec.note_event(xid_event(79))
    rec.note_event(xid_event(13, pci="0000:5e:00.0", uuid="GPU-5678"))
    await sync(rec, [], rules=[], xid=True)
    cond = connector.condition("NvdaemonGpuXidError")
    assert cond is not None and cond["status"] == "True"
    assert "ErrorCode:79 PCI:0000:3b:00.0 GPU_UUID:GPU-1234" in cond["message"]
    assert "Recommended Action=RESTART_BM;" in cond["message"]
    (warning,) = connector.events_for("NvdaemonGpuXidError")  # XID 13: action NONE, so not fatal: an Event
    assert "XID 13" in warning["message"]

    # A restart without a reboot: the XIDs stay raised, nothing is re-sent.
    sent = len(connector.ok_events())
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [], rules=[], xid=True)
    assert len(connector.ok_events()) == sent
    assert connector.condition("NvdaemonGpuXidError")["status"] == "True"  # type: ignore[index]

    boot_id.write_text("8a3c2f6e-0000-4000-8000-000000000002\n")  # rebooted
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, [], rules=[], xid=True)
    clears = connector.ok_events()[sent:]
    assert sorted((list(e.errorCode), e.isHealthy) for e in clears) == [(["13"], True), (["79"], True)]
    assert {tuple((x.entityType, x.entityValue) for x in e.entitiesImpacted) for e in clears} == {
        (("PCI", "0000:3b:00.0"), ("GPU_UUID", "GPU-1234")),
        (("PCI", "0000:5e:00.0"), ("GPU_UUID", "GPU-5678")),
    }
    assert connector.condition("NvdaemonGpuXidError") == {
        "type": "NvdaemonGpuXidError",
        "status": "False",
        "reason": "NvdaemonGpuXidErrorIsHealthy",
        "message": "No Health Failures",
    }
    assert persisted(rec)["xids"] == [] and persisted(rec)["reported"] == []
    assert persisted(rec)["bootId"] == "8a3c2f6e-0000-4000-8000-000000000002"


async def test_xid_action_override_from_config(connector: FakeConnector, make_reconciler: MakeReconciler) -> None:
    connector.start()
    rec = make_reconciler(healthy_baseline=False, xid_actions={"13": "COMPONENT_RESET"})
    await trio.to_thread.run_sync(rec.load)
    rec.note_event(xid_event(13))
    await sync(rec, [], rules=[], xid=True)
    (event,) = connector.ok_events()
    assert event.isFatal and event.recommendedAction == pb.COMPONENT_RESET


async def test_token_never_in_logs_or_state(
    connector: FakeConnector, make_reconciler: MakeReconciler, token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    connector.start()
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    connector.script.append(grpc.StatusCode.UNAUTHENTICATED)
    await sync(rec, [active(HOT, 97.0)])
    await sync(rec, [active(HOT, 97.0)])
    token_file.write_bytes(b"\n")
    await sync(rec, [])
    assert rec.errors == {"UNAUTHENTICATED": 1, "TOKEN_ERROR": 1}
    assert rec.success == 3
    assert "UNAUTHENTICATED" in caplog.text and "token file" in caplog.text
    assert TOKEN not in caplog.text
    assert TOKEN not in json.dumps(rec.state())
    assert TOKEN.encode() not in rec.state_path.read_bytes()


async def test_damaged_state_file_is_quarantined(
    connector: FakeConnector, make_reconciler: MakeReconciler, tmp_path: Path
) -> None:
    state = tmp_path / "state" / "nvsentinel.json"
    state.parent.mkdir()
    state.write_bytes(b"{not json")
    rec = make_reconciler()
    await trio.to_thread.run_sync(rec.load)
    assert list(state.parent.glob("nvsentinel.json.corrupt-*"))
    connector.start()
    await sync(rec, [active(HOT, 97.0)])
    assert rec.pending == 0 and msgspec.json.decode(state.read_bytes())["reported"]


def _metric(rec: Reconciler, name: str, **labels: str) -> float:
    families = list(rec.metrics())
    want = {"monitor": "nvdaemon", **labels}
    values = [s.value for fam in families for s in fam.samples if s.name == name and s.labels == want]
    assert len(values) == 1, render(families)
    return values[0]
