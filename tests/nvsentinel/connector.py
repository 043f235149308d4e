"""A test NVSentinel platform-connector: a real grpc server on a Unix socket, built from our own .proto.

It enforces what the real one enforces and keeps the node's conditions and Events the way it would write them to
Kubernetes (DESIGN §8), so tests assert on what an operator would see with ``kubectl get node -o jsonpath=...``:

- ``authorization: Bearer <token>`` checked against the *current* token in the token file, the whitespace around
  it left out (UNAUTHENTICATED);
- a ``nodeName`` other than its own: PERMISSION_DENIED; CUSTOM without ``customRecommendedAction``:
  INVALID_ARGUMENT; processingStrategy UNSPECIFIED is stored as EXECUTE_REMEDIATION;
- fatal unhealthy events and healthy events become the node condition ``Type = checkName`` (Status True, Reason
  ``<check>IsNotHealthy``, one ``... Recommended Action=<action>;`` entry per (entities, errorCode); or Status
  False, Reason ``<check>IsHealthy``, Message ``No Health Failures``); a healthy event with no entities clears the
  whole condition; non-fatal unhealthy events become Kubernetes Events. ``;`` in a message is rewritten; condition
  messages are capped at 1024 characters.

``script`` queues answers for the next calls (a status code to abort with, or None to process normally); a
callable in it runs first (e.g. to stop the server mid-retry).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2

from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.proto import health_event_pb2_grpc as pb_grpc

MESSAGE_CAP = 1024
Answer = grpc.StatusCode | None | Callable[[], grpc.StatusCode | None]


@dataclass
class Received:
    metadata: dict[str, str]
    event: pb.HealthEvent
    code: str  # OK or the status the call was answered with


@dataclass
class Condition:
    type: str
    status: str = "False"
    reason: str = ""
    message: str = ""
    entries: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], str] = field(default_factory=dict)
    transitions: int = 0


class FakeConnector:
    def __init__(self, socket_path: Path, node: str, token_file: Path | None) -> None:
        self.socket_path = socket_path
        self.node = node
        self.token_file = token_file
        self.lock = threading.Lock()
        self.received: list[Received] = []
        self.conditions: dict[str, Condition] = {}
        self.k8s_events: list[dict[str, Any]] = []
        self.script: collections.deque[Answer] = collections.deque()
        self.server: grpc.Server | None = None

    # ---- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> FakeConnector:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_PlatformConnectorServicer_to_server(_Servicer(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix:{self.socket_path}")
        server.start()
        self.server = server
        return self

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop(None).wait(5)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # ---- what kubectl would show -------------------------------------------------------------------------------
    def node_json(self) -> dict[str, Any]:
        """``kubectl get node <node> -o json``, the parts this connector writes."""
        with self.lock:
            conds = [
                {"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
                for c in self.conditions.values()
            ]
        return {"metadata": {"name": self.node}, "status": {"conditions": conds}}

    def condition(self, check: str) -> dict[str, str] | None:
        """``kubectl get node -o jsonpath='{.status.conditions[?(@.type=="<check>")]}'``."""
        return next((c for c in self.node_json()["status"]["conditions"] if c["type"] == check), None)

    def events_for(self, check: str) -> list[dict[str, Any]]:
        """``kubectl get events --field-selector involvedObject.kind=Node,reason=<check>IsNotHealthy``."""
        with self.lock:
            return [e for e in self.k8s_events if e["reason"] == f"{check}IsNotHealthy"]

    def ok_events(self) -> list[pb.HealthEvent]:
        with self.lock:
            return [r.event for r in self.received if r.code == "OK"]

    def calls(self) -> list[Received]:
        with self.lock:
            return list(self.received)

    # ---- the rules -----------------------------------------------------------------------------------------------
    def handle(self, request: pb.HealthEvents, context: grpc.ServicerContext) -> empty_pb2.Empty:
        metadata = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        answer: Answer = None
        with self.lock:
            if self.script:
                answer = self.script.popleft()
        if callable(answer):
            answer = answer()
        code = answer or self._check(request, metadata)
        with self.lock:
            for ev in request.events:
                self.received.append(Received(metadata, ev, code.name if code else "OK"))
        if code is not None:
            context.abort(code, f"test connector: {code.name}")
        with self.lock:
            for ev in request.events:
                self._apply(ev)
        return empty_pb2.Empty()

    def _check(self, request: pb.HealthEvents, metadata: dict[str, str]) -> grpc.StatusCode | None:
        if self.token_file is not None:
            expected = "Bearer " + self.token_file.read_text().strip()  # a token holds no whitespace
            if metadata.get("authorization") != expected:
                return grpc.StatusCode.UNAUTHENTICATED
        for ev in request.events:
            if ev.nodeName != self.node:
                return grpc.StatusCode.PERMISSION_DENIED
            if ev.recommendedAction == pb.CUSTOM and not ev.customRecommendedAction:
                return grpc.StatusCode.INVALID_ARGUMENT
        return None

    def _apply(self, ev: pb.HealthEvent) -> None:
        if ev.processingStrategy == pb.UNSPECIFIED:
            ev.processingStrategy = pb.EXECUTE_REMEDIATION
        check = ev.checkName
        message = ev.message.replace(";", ",")
        entities = tuple((e.entityType, e.entityValue) for e in ev.entitiesImpacted)
        codes = tuple(ev.errorCode)
        if not ev.isHealthy and not ev.isFatal:
            self.k8s_events.append(
                {
                    "involvedObject": {"kind": "Node", "name": self.node},
                    "type": "Warning",
                    "reason": f"{check}IsNotHealthy",
                    "message": message,
                }
            )
            return
        cond = self.conditions.setdefault(check, Condition(check))
        before = cond.status
        if ev.isHealthy:
            if not entities:
                cond.entries.clear()
            else:
                for k in [k for k in cond.entries if k[0] == entities and (not codes or k[1] == codes)]:
                    del cond.entries[k]
        else:
            action = pb.RecommendedAction.Name(ev.recommendedAction)
            what = " ".join(f"{t}:{v}" for t, v in entities)
            cond.entries[(entities, codes)] = (
                f"ErrorCode:{','.join(codes)} {what} {message} Recommended Action={action};".replace("  ", " ")
            )
        if cond.entries:
            cond.status, cond.reason = "True", f"{check}IsNotHealthy"
            cond.message = "".join(cond.entries.values())[:MESSAGE_CAP]
        else:
            cond.status, cond.reason, cond.message = "False", f"{check}IsHealthy", "No Health Failures"
        if cond.status != before:
            cond.transitions += 1


class _Servicer(pb_grpc.PlatformConnectorServicer):
    def __init__(self, connector: FakeConnector) -> None:
        self.connector = connector

    def HealthEventOccurredV1(  # the generated method name
        self, request: pb.HealthEvents, context: grpc.ServicerContext
    ) -> empty_pb2.Empty:
        return self.connector.handle(request, context)
