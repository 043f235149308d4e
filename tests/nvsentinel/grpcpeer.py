"""A grpcio server on a Unix socket that answers ``HealthEventOccurredV1`` as a test tells it to: the peer for the
cases of tests/nvsentinel/test_wire.py and test_grpcio_cases.py, where the platform-connector of connector.py does
more than a test needs and less than it must control (the answer's bytes, trailers, compression, server options).

``handle(request, context)`` gets the decoded ``HealthEvents`` and returns the answer's serialized bytes (``b""`` is
``google.protobuf.Empty``); it may abort, set trailers or block. Every request is kept in ``requests`` with its
metadata.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from nvdaemon.proto import health_event_pb2 as pb

SERVICE, METHOD = "datamodels.PlatformConnector", "HealthEventOccurredV1"
Handle = Callable[[pb.HealthEvents, grpc.ServicerContext], bytes]


def ok(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
    return b""


class GrpcPeer:
    def __init__(
        self,
        socket_path: Path,
        handle: Handle = ok,
        *,
        compression: grpc.Compression | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.socket_path = socket_path
        self.handle = handle
        self.compression = compression
        self.options = list(options)
        self.lock = threading.Lock()
        self.requests: list[tuple[dict[str, str], pb.HealthEvents]] = []
        self.server: grpc.Server | None = None

    def _serve(self, request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        with self.lock:
            self.requests.append((metadata, request))
        return self.handle(request, context)

    def start(self) -> GrpcPeer:
        handler: grpc.RpcMethodHandler[pb.HealthEvents, bytes] = grpc.unary_unary_rpc_method_handler(
            self._serve, request_deserializer=pb.HealthEvents.FromString
        )
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4), compression=self.compression, options=self.options
        )
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {METHOD: handler})])
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self.server = server
        return self

    def stop(self, grace: float | None = None) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop(grace).wait(10)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def calls(self) -> int:
        with self.lock:
            return len(self.requests)

    def __enter__(self) -> GrpcPeer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def peer(socket_path: Path, handle: Handle = ok, **kwargs: Any) -> Iterator[GrpcPeer]:
    with GrpcPeer(socket_path, handle, **kwargs) as p:
        yield p
