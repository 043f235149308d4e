"""A test kubelet: a real gRPC server on a Unix socket serving ``v1.PodResourcesLister`` from our own stubs.

``pods`` is what ``List`` answers (in order); ``mode`` scripts the failures an agent must survive: ``"ok"``,
``"hang"`` (the handler blocks until the kubelet stops or the mode changes back) and ``"garbage"`` (the response
bytes are not a ``ListPodResourcesResponse``). ``get=False`` leaves ``Get`` unregistered, as a kubelet without the
``KubeletPodResourcesGet`` gate answers: UNIMPLEMENTED. ``stop()`` removes the socket (the kubelet went away).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from nvdaemon.proto import podresources_pb2 as pb

GARBAGE = b"\xff\xff\xff\xff\x0f"  # field 31, wire type 7: no protobuf parser accepts it

Device = tuple[str, list[str]]  # (resource name, device ids)


def pod(namespace: str, name: str, *containers: tuple[str, list[Device]]) -> pb.PodResources:
    out = pb.PodResources(name=name, namespace=namespace)
    for cname, devices in containers:
        c = out.containers.add(name=cname)
        for resource, ids in devices:
            c.devices.add(resource_name=resource, device_ids=ids)
    return out


class TestKubelet:
    __test__ = False  # not a pytest class

    def __init__(self, socket_path: Path, *, get: bool = True) -> None:
        self.socket_path = socket_path
        self.get_offered = get
        self.pods: list[pb.PodResources] = []
        self.mode = "ok"
        self.calls: collections.Counter[str] = collections.Counter()
        self._changed = threading.Condition()
        self._server: grpc.Server | None = None

    def set_pods(self, *pods: pb.PodResources) -> None:
        with self._changed:
            self.pods = list(pods)

    def set_mode(self, mode: str) -> None:
        with self._changed:
            self.mode = mode
            self._changed.notify_all()

    # ---- handlers -------------------------------------------------------------------------------------------
    def _list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        with self._changed:
            self.calls["List"] += 1
            while self.mode == "hang" and self._server is not None:
                self._changed.wait(0.1)
            if self.mode == "garbage":
                return GARBAGE
            return pb.ListPodResourcesResponse(pod_resources=self.pods)

    def _get(self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        with self._changed:
            self.calls["Get"] += 1
            for p in self.pods:
                if (p.namespace, p.name) == (request.pod_namespace, request.pod_name):
                    return pb.GetPodResourcesResponse(pod_resources=p)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")

    @staticmethod
    def _serialise(message: Any) -> bytes:
        return message if isinstance(message, bytes) else bytes(message.SerializeToString())

    # ---- lifecycle ------------------------------------------------------------------------------------------
    def start(self) -> TestKubelet:
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=self._serialise,
            )
        }
        if self.get_offered:
            handlers["Get"] = grpc.unary_unary_rpc_method_handler(
                self._get,
                request_deserializer=pb.GetPodResourcesRequest.FromString,
                response_serializer=self._serialise,
            )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", handlers),))
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        self.set_mode(self.mode)  # wake a hanging handler: it sees the server gone
        if server is not None:
            server.stop(grace=None).wait(5)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> TestKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
