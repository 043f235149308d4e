"""Which pod holds each GPU, from the kubelet's pod-resources API (``dcgmCompat.podAttribution``).

The kubelet serves ``v1.PodResourcesLister`` (``protos/podresources.proto``) over gRPC on a Unix socket,
``dcgmCompat.podResourcesSocket`` (default ``/var/lib/kubelet/pod-resources/kubelet.sock``). The supervised task
``source:podresources`` calls ``List`` once per gpu tier interval, in a worker thread under its own limiter (sync
stubs: grpc.aio does not run under trio), with a deadline of ``dcgmCompat.podResourcesTimeoutSeconds``; a fresh
channel per call, so a kubelet restart (a new socket inode) costs nothing. The answer is matched to the GPUs
(``nvdaemon/gpu/attribution.py``) and kept on the GPU runtime: the gpu tier, the XID source and the dcgm surface
read the latest one and never wait for a call.

A socket that is missing, refuses, is slower than the deadline or answers what does not parse turns attribution
off until the next call that works: no pod labels on ``DCGM_FI_*``, no ``detail.pods`` on events. Each failure is
counted (``nodevitals_podresources_failures_total{reason}``) and logged when the reason changes, not every tick.

*Bounded*: the answer is refused by gRPC past ``MAX_ANSWER_BYTES`` (1 MiB, not grpcio's 4 MiB), before it is read;
of what is read, only containers holding ``nvidia.com/`` devices are kept, at most ``MAX_GPU_DEVICE_IDS`` device ids,
names and ids cut to Kubernetes' own length limits. An answer over either bound is a failure like the others
(reason ``too_large``): attribution goes off rather than keep the last mapping, whose pods may have moved since.
``Get`` (one pod; kubelet 1.27+ behind a feature gate, beta and on by default from 1.34) is offered by the client
for completeness; the mapping needs only ``List``, which already carries every pod's devices.
"""

from __future__ import annotations

import collections
import logging
import os
import stat
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import trio

from nvdaemon.exposition import CounterMetricFamily, GaugeMetricFamily, Metric
from nvdaemon.gpu.attribution import GPU_RESOURCE_PREFIX, Allocation, Attribution, attribute, keys_for

if TYPE_CHECKING:
    import grpc

    from nvdaemon.config import DcgmCompatConfig
    from nvdaemon.nvml import GpuIdentity

log = logging.getLogger(__name__)


class AttributedGpus(Protocol):
    """What attribution reads and sets on the GPU runtime (``nvdaemon.gpu.GpuRuntime``, which imports this module for
    ``PodAttribution``: the shape is declared here so that this module needs nothing of the runtime's)."""

    pod_attribution: PodAttribution | None  # set while the refresh task runs

    @property
    def identities(self) -> Mapping[int, GpuIdentity]: ...  # gpu index -> identity


TASK_NAME = "source:podresources"  # "source:" tasks stop with the tier loops, before the sinks flush
REASONS = ("missing", "refused", "timeout", "garbage", "unimplemented", "too_large", "error")
# The largest ``List`` answer read. A pod's entry is 100-300 bytes (names, a device id of ~40 bytes per GPU, CPU ids);
# a node runs 110 pods by default and at most a few hundred (the largest managed node types allow ~740), so even 1,000
# pods with sidecars fit several times over. grpcio's default is 4 MiB, whose decoding cost 237 MB and 1.4 cores.
MAX_ANSWER_BYTES = 1024 * 1024
# Device ids of ``nvidia.com/`` resources kept from one answer: 16 GPUs x 7 MIG slices, or time-slicing replicas,
# stay far below; more is not a real node.
MAX_GPU_DEVICE_IDS = 4096
NAME_MAX = 253  # Kubernetes' longest object name (a DNS subdomain); namespaces and containers are shorter
DEVICE_ID_MAX = 256  # a GPU or MIG UUID is ~45 bytes; a longer id names no GPU and is kept only as unmatched, cut


class PodResourcesError(Exception):
    """A call that gave no usable answer; ``reason`` is one of ``REASONS`` (the failure metric's label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def _classify(exc: grpc.RpcError) -> PodResourcesError:
    import grpc  # loaded already: the call that failed ran through it

    if not isinstance(exc, grpc.Call):
        return PodResourcesError("error", str(exc))
    code = exc.code()
    reason = {
        grpc.StatusCode.UNAVAILABLE: "refused",
        grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
        grpc.StatusCode.INTERNAL: "garbage",  # "Exception deserializing response!" and malformed frames
        grpc.StatusCode.UNIMPLEMENTED: "unimplemented",
        grpc.StatusCode.RESOURCE_EXHAUSTED: "too_large",  # over MAX_ANSWER_BYTES: refused before it was read
    }.get(code, "error")
    detail = exc.details() or str(code)
    if reason == "too_large":
        detail = f"answer over the {MAX_ANSWER_BYTES // 1024} KiB limit, not read ({detail})"
    return PodResourcesError(reason, detail)


def allocations(pods: Any, prefix: str = "") -> list[Allocation]:
    """``Allocation`` rows of a list of ``PodResources`` for resources named ``prefix...``, in the kubelet's order;
    names cut to ``NAME_MAX``, device ids to ``DEVICE_ID_MAX``. ``PodResourcesError("too_large")`` past
    ``MAX_GPU_DEVICE_IDS`` device ids."""
    out = []
    ids = 0
    for pod in pods:
        for container in pod.containers:
            for dev in container.devices:
                if not dev.resource_name.startswith(prefix):
                    continue
                ids += len(dev.device_ids)
                if ids > MAX_GPU_DEVICE_IDS:
                    raise PodResourcesError("too_large", f"more than {MAX_GPU_DEVICE_IDS} device ids in the answer")
                out.append(
                    Allocation(
                        pod.namespace[:NAME_MAX],
                        pod.name[:NAME_MAX],
                        container.name[:NAME_MAX],
                        dev.resource_name[:NAME_MAX],
                        tuple(d[:DEVICE_ID_MAX] for d in dev.device_ids),
                    )
                )
    return out


class PodResourcesClient:
    """Blocking calls to the kubelet (run them in worker threads); every failure is a ``PodResourcesError``."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def _call(self, method: str, request: Any) -> Any:
        # grpc here, not at the top: 8.5-11 MiB of RSS (bench/rss.py), loaded only by an agent that attributes pods
        import grpc

        from nvdaemon.proto import podresources_pb2_grpc as rpc

        try:
            mode = os.stat(self.socket_path).st_mode
        except OSError as exc:
            raise PodResourcesError("missing", f"{self.socket_path}: {exc.strerror}") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError("missing", f"{self.socket_path}: not a socket")
        target = "unix://" + os.path.abspath(self.socket_path)
        options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
        with grpc.insecure_channel(target, options=options) as channel:
            stub = rpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]
            try:
                return getattr(stub, method)(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                raise _classify(exc) from None

    def list_allocations(self, prefix: str = "") -> list[Allocation]:
        """Every allocation of resources named ``prefix...`` (all by default)."""
        from nvdaemon.proto import podresources_pb2 as pb

        response = self._call("List", pb.ListPodResourcesRequest())
        return allocations(response.pod_resources, prefix)

    def get_allocations(self, namespace: str, pod: str) -> list[Allocation] | None:
        """One pod's devices; None where the kubelet does not offer ``Get``."""
        from nvdaemon.proto import podresources_pb2 as pb

        try:
            response = self._call("Get", pb.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace))
        except PodResourcesError as exc:
            if exc.reason == "unimplemented":
                return None
            raise
        return allocations([response.pod_resources])


class PodAttribution:
    """The latest mapping and the health of the calls; read by the tier, the XID source and the dcgm surface."""

    def __init__(self, client: PodResourcesClient) -> None:
        self.client = client
        self.current: Attribution | None = None  # None: off (no call has worked yet, or the last one failed)
        self.failures: collections.Counter[str] = collections.Counter({r: 0 for r in REASONS})
        self.last_reason = ""  # the reason of the failure last logged; "" while calls work
        self.calls = 0
        self._lock = threading.Lock()
        self._in_flight = False

    @property
    def up(self) -> bool:
        return self.current is not None

    def status(self) -> dict[str, Any]:
        """For ``/v1/status`` (the gpu collector's detail): up, the holders per GPU, failures by reason."""
        current = self.current
        holders = {} if current is None else {f"gpu{i}": current.pods(i) for i in current.holders}
        return {"up": self.up, "holders": holders, "failures": dict(self.failures), "lastError": self.last_reason}

    def pods(self, index: int) -> list[dict[str, str]] | None:
        """``detail.pods`` for an event on GPU ``index``: None while attribution is off (unknown, not "nobody")."""
        return None if self.current is None else self.current.pods(index)

    def call_list(self) -> list[Allocation]:
        """``List`` in a worker thread; one at a time: a call still stuck after its deadline skips the next ticks."""
        with self._lock:
            if self._in_flight:
                raise PodResourcesError("timeout", "the previous List has not returned")
            self._in_flight = True
        try:
            return self.client.list_allocations(GPU_RESOURCE_PREFIX)  # the rest is never matched: not kept
        finally:
            with self._lock:
                self._in_flight = False

    def failed(self, err: PodResourcesError) -> bool:
        """Attribution off; True when something visible changed."""
        self.failures[err.reason] += 1
        changed = self.current is not None
        self.current = None
        if err.reason != self.last_reason:
            log.warning("pod attribution off: kubelet pod-resources %s", err)
            self.last_reason = err.reason
        return changed

    def succeeded(self, allocs: list[Allocation], rt: AttributedGpus) -> bool:
        """Match the answer to the GPUs; True when the mapping changed."""
        keys = keys_for((g.index, g.uuid, g.mig_uuids) for g in rt.identities.values())
        new = attribute(allocs, keys)
        if self.last_reason or self.calls == 1:
            log.info("pod attribution on: %d GPU(s) held by pods", len(new.holders))
            self.last_reason = ""
        if new.unmatched and (self.current is None or new.unmatched != self.current.unmatched):
            log.info("pod attribution: device ids matching no GPU of this node: %s", ", ".join(new.unmatched[:8]))
        changed = new != self.current
        self.current = new
        return changed


async def refresh(
    rt: AttributedGpus, pa: PodAttribution, limiter: trio.CapacityLimiter, on_change: Callable[[], None]
) -> None:
    """One ``List``; never raises for a kubelet problem (counted and logged instead). ``on_change`` is called when
    what /metrics shows changed (labels moved, attribution on or off)."""
    pa.calls += 1
    deadline = pa.client.timeout + 1.0  # gRPC's own deadline fires first; this is the backstop
    try:
        with trio.fail_after(deadline):
            allocs = await trio.to_thread.run_sync(pa.call_list, limiter=limiter, abandon_on_cancel=True)
    except trio.TooSlowError:
        changed = pa.failed(PodResourcesError("timeout", f"no answer within {deadline:g}s"))
    except PodResourcesError as err:
        changed = pa.failed(err)
    except Exception as exc:  # a kubelet answer we could not read must not restart-loop the task
        changed = pa.failed(PodResourcesError("garbage", f"{type(exc).__name__}: {exc}"))
    else:
        changed = pa.succeeded(allocs, rt)
    if changed:
        on_change()


async def serve_podresources(
    rt: AttributedGpus,
    cfg: DcgmCompatConfig,
    interval: float,
    on_change: Callable[[], None],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Refresh the pod attribution of ``rt`` every ``interval`` seconds (the GPU tier's) until cancelled."""
    pa = PodAttribution(PodResourcesClient(cfg.pod_resources_socket, cfg.pod_resources_timeout_seconds))
    rt.pod_attribution = pa
    limiter = trio.CapacityLimiter(1)  # kubelet calls have their own limiter: never an NVML thread's
    try:
        task_status.started()
        next_tick = trio.current_time()
        while True:
            await refresh(rt, pa, limiter, on_change)
            next_tick = max(next_tick + interval, trio.current_time())
            await trio.sleep_until(next_tick)
    finally:
        if rt.pod_attribution is pa:
            rt.pod_attribution = None
            on_change()


def fingerprint(cfg: DcgmCompatConfig, interval: float) -> Hashable:
    """What the refresh task was started with: a reload restarts it when this differs."""
    return (TASK_NAME, cfg.pod_attribution, cfg.pod_resources_socket, cfg.pod_resources_timeout_seconds, interval)


def podresources_metrics(gpu: AttributedGpus | None) -> Iterator[Metric]:
    """``nodevitals_podresources_up`` and ``_failures_total{reason}``, while attribution is configured."""
    pa = gpu.pod_attribution if gpu is not None else None
    if pa is None:
        return
    up = GaugeMetricFamily(
        "nodevitals_podresources_up",
        "1 if the last kubelet pod-resources List worked and GPU series and events carry their pods.",
    )
    up.add_metric([], 1.0 if pa.up else 0.0)
    failures = CounterMetricFamily(
        "nodevitals_podresources_failures",
        "kubelet pod-resources List calls that gave no answer, by reason (attribution off for that tick).",
        labels=["reason"],
    )
    for reason in REASONS:
        failures.add_metric([reason], pa.failures[reason])
    yield up
    yield failures
