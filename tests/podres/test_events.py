"""detail.pods on GPU events: XID and gpu_lost from the GPU runtime, rule events from the engine (the EXIT keeps
its ENTER's holders, across a restart too), the NVSentinel message text, the tail line, and the MIG device list the
real NVML backend reads."""

from __future__ import annotations

import json

import pynvml  # type: ignore[import-untyped]

from nvdaemon import engine
from nvdaemon.config import Rule
from nvdaemon.configload import parse_config
from nvdaemon.gpu import GpuRuntime
from nvdaemon.gpu.attribution import Allocation
from nvdaemon.gpu.podresources import PodAttribution, PodResourcesClient
from nvdaemon.model import Event, Kind, Phase, Sample, new_event_id
from nvdaemon.nvml import GpuIdentity, XidNotice
from nvdaemon.nvml.fake import FakeNvml
from nvdaemon.nvml.real import RealNvml
from nvdaemon.sinks.cloudevent import encode
from nvdaemon.sinks.nvsentinel.map import lost_health, rule_health, xid_health
from nvdaemon.sinks.nvsentinel.sink import lost_record, xid_record
from nvdaemon.tail import format_line
from tests.gpu.recorder import RecordingNvml

TRAIN = {"namespace": "ml", "pod": "train", "container": "main"}


def runtime_with_holders() -> tuple[GpuRuntime, list[Event]]:
    fake = FakeNvml({"devices": [{"uuid": "GPU-a"}, {"uuid": "GPU-b"}]})
    emitted: list[Event] = []
    rt = GpuRuntime(fake, fake.open(), node="n", emit=emitted.extend)
    pa = PodAttribution(PodResourcesClient("/nonexistent", 1.0))
    pa.calls = 2
    pa.succeeded([Allocation("ml", "train", "main", "nvidia.com/gpu", ("GPU-a",))], rt)
    rt.pod_attribution = pa
    return rt, emitted


def test_xid_and_gpu_lost_carry_the_holders_and_the_lost_exit_keeps_its_enters() -> None:
    rt, emitted = runtime_with_holders()
    rt.on_xids([XidNotice(0, 79), XidNotice(1, 13), XidNotice(None, 31)], now=1.0)
    assert [e.detail.get("pods") for e in emitted] == [[TRAIN], [], None]
    rt.set_lost(rt.identity(0), True, 2.0, "lost")
    assert rt.pod_attribution is not None
    rt.pod_attribution.current = None  # the kubelet went away meanwhile
    rt.set_lost(rt.identity(0), False, 3.0)
    enter, exit_ = emitted[-2:]
    assert (enter.phase, exit_.phase) == (Phase.ENTER, Phase.EXIT)
    assert enter.detail["pods"] == exit_.detail["pods"] == [TRAIN]
    rt.on_xids([XidNotice(0, 79)], now=4.0)
    assert emitted[-1] is exit_  # the same XID on the same GPU again: folded into its first event, none new
    rt.on_xids([XidNotice(0, 48)], now=4.0)
    assert emitted[-1].detail["xid"] == 48
    assert "pods" not in emitted[-1].detail  # attribution off: unknown, no key


def test_without_attribution_events_are_unchanged() -> None:
    fake = FakeNvml({"devices": [{"uuid": "GPU-a"}]})
    emitted: list[Event] = []
    rt = GpuRuntime(fake, fake.open(), node="n", emit=emitted.extend)
    rt.on_xids([XidNotice(0, 79)], now=1.0)
    assert set(emitted[0].detail) == {"xid", "description", "gpu_uuid", "pci_bus_id", "sources"}


def test_rule_exit_carries_the_enter_holders_across_a_restart() -> None:
    rules = engine.compile_rules([Rule(metric="gpu_temperature_celsius", condition="gpu_hot", threshold=80)])
    state = engine.EngineState()
    holders = {"gpu0": [TRAIN]}

    def tick(value: float, now: float, pods: dict[str, list[dict[str, str]]]) -> list[Event]:
        sample = Sample("gpu_temperature_celsius", "gpu0", value, Kind.GAUGE, (), "gpu", now)
        return engine.evaluate(
            state, rules, [sample], tier="gpu", node="n", now=now, new_id=new_event_id, pods=pods.get
        )

    (enter,) = tick(90, 1.0, holders)
    assert enter.detail["pods"] == [TRAIN]
    state = engine.load_state(engine.dump_state(state))  # a restart
    (exit_,) = tick(20, 2.0, {})  # the pod is gone by now
    assert exit_.phase is Phase.EXIT and exit_.detail["pods"] == [TRAIN]
    # engine.json written before pod attribution existed still loads: no pods, none in the events
    old = json.loads(engine.dump_state(engine.EngineState()))
    assert "pods" not in json.dumps(old)
    (plain,) = engine.evaluate(
        engine.EngineState(),
        rules,
        [Sample("gpu_temperature_celsius", "gpu0", 90, Kind.GAUGE, (), "gpu", 1.0)],
        tier="gpu",
        node="n",
        now=1.0,
        new_id=new_event_id,
    )
    assert "pods" not in plain.detail


def test_nvsentinel_message_and_tail_line_name_the_pods() -> None:
    rt, emitted = runtime_with_holders()
    rt.on_xids([XidNotice(0, 79)], now=1.0)
    rec = xid_record(emitted[0])
    assert rec is not None
    assert xid_health(rec).message.endswith("GPU has fallen off the bus (pods: ml/train/main)")
    cond = engine.ActiveCondition(
        rule_key="k",
        metric="gpu_temperature_celsius",
        device="gpu0",
        labels=(),
        condition="gpu_hot",
        severity="warning",
        tier="gpu",
        threshold=80,
        started_at=1,
        enter_id="x",
        value=90,
        last_seen=1,
        pods=[TRAIN],
    )
    assert rule_health(cond).message.endswith("threshold > 80 (pods: ml/train/main)")
    rt.set_lost(rt.identity(0), True, 2.0, "GPU is lost")
    assert lost_health(lost_record(emitted[-1])).message.endswith("fell off the bus: GPU is lost (pods: ml/train/main)")
    line = format_line(json.loads(encode(emitted[0])[1]), colour=False)
    assert line.endswith("xid=79 GPU has fallen off the bus pods=ml/train/main")


def test_real_backend_reads_mig_device_uuids_and_rereads_them() -> None:
    lib = RecordingNvml(gpus=2)
    lib.mig = {1: ["MIG-aaaa", "MIG-bbbb"]}
    backend = RealNvml(lib)
    ids = backend.open()
    assert ids[0].mig_uuids == () and ids[1].mig_uuids == ("MIG-aaaa", "MIG-bbbb")
    assert ("nvmlDeviceGetMigDeviceHandleByIndex", lib.handles[1], 2) in lib.calls  # slot 2 empty: skipped
    lib.mig[1] = ["MIG-cccc"]  # reconfigured
    assert backend.snapshot(1).identity.mig_uuids == ("MIG-cccc",)
    lib.errors[0]["nvmlDeviceGetMigMode"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend.snapshot(0)
    lib.calls.clear()
    backend.snapshot(0)
    assert not [c for c in lib.calls if c[0] == "nvmlDeviceGetMigMode"], "a GPU without MIG is not asked again"


def test_fake_scenario_mig_list_and_config_defaults() -> None:
    fake = FakeNvml({"devices": [{"uuid": "GPU-a", "mig": ["MIG-1"]}]})
    assert fake.open() == [GpuIdentity(0, "GPU-a", mig_uuids=("MIG-1",))]
    dcgm = parse_config("{}", "t.yaml", env={}).config.dcgm_compat
    assert (dcgm.pod_attribution, dcgm.pod_resources_socket, dcgm.pod_resources_timeout_seconds) == (
        False,
        "/var/lib/kubelet/pod-resources/kubelet.sock",
        5.0,
    )


def test_tail_skips_pods_entries_that_are_not_objects() -> None:
    """A stream event whose detail.pods holds something other than objects prints without them, never a crash."""

    def line(pods: object) -> str:
        data = {"node": "n", "severity": "critical", "phase": "ENTER", "detail": {"pods": pods}}
        return format_line({"time": "t", "data": data}, colour=False)

    assert line(["ml/train/main", {"namespace": "ml", "pod": "p", "container": "c"}, 7]).endswith(" pods=ml/p/c")
    assert "pods=" not in line(["ml/train/main"])
    assert "pods=" not in line(7)
