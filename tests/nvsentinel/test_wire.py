"""The one gRPC call on the wire, against peers that misbehave (tests/nvsentinel/h2peer.py) and a real grpcio server:
what the request looks like, and which failure ``classify`` names and retries. The expected codes are grpcio's for
the same answers (the agent called the platform-connector with grpcio before), so a metric label or a retry does not
change with the transport."""

from __future__ import annotations

import socket
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import empty_pb2

from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.sinks.nvsentinel import GrpcPublisher, classify
from nvdaemon.sinks.nvsentinel_wire import METHOD, SendError
from tests.nvsentinel.conftest import TOKEN
from tests.nvsentinel.h2peer import H2Peer

REQUEST_PB = pb.HealthEvents(
    version=1,
    events=[pb.HealthEvent(version=1, agent="nvdaemon", checkName="NvdaemonGpuXidError", nodeName="node-a")],
)
REQUEST = REQUEST_PB.SerializeToString()


def failure(socket_path: Path, token_path: str = "", timeout: float = 5.0) -> SendError:
    """What the reconciler would count for one call to the peer on ``socket_path``."""
    try:
        GrpcPublisher(str(socket_path), token_path, timeout).send(REQUEST)
    except Exception as exc:
        return classify(exc)
    raise AssertionError("the call succeeded")


def test_the_request_is_one_grpc_message_with_the_token(socket_path: Path, token_file: Path) -> None:
    with H2Peer(socket_path, "ok") as peer:
        GrpcPublisher(str(socket_path), str(token_file), 5.0).send(REQUEST)
        GrpcPublisher(str(socket_path), "", 5.0).send(REQUEST)
    (headers, body), (untokened, _) = peer.requests
    assert headers[":method"] == "POST" and headers[":path"] == METHOD and headers[":scheme"] == "http"
    assert headers["content-type"].startswith("application/grpc") and headers["te"] == "trailers"
    assert headers["authorization"] == f"Bearer {TOKEN}"
    timeout = headers["grpc-timeout"]
    assert timeout[:-1].isdigit() and len(timeout) <= 9 and timeout[-1] in "HMSmun"
    assert body[0] == 0 and int.from_bytes(body[1:5], "big") == len(body) - 5
    assert body[5:] == REQUEST and pb.HealthEvents.FromString(body[5:]) == REQUEST_PB
    assert "authorization" not in untokened


@pytest.mark.parametrize("shape", ["trailers-only", "status"])
@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (16, "UNAUTHENTICATED", False),
        (7, "PERMISSION_DENIED", False),
        (3, "INVALID_ARGUMENT", False),
        (8, "RESOURCE_EXHAUSTED", False),
        (14, "UNAVAILABLE", True),
        (4, "DEADLINE_EXCEEDED", True),
        (13, "INTERNAL", False),
    ],
)
def test_grpc_status_in_trailers_or_trailers_only(
    socket_path: Path, shape: str, status: int, code: str, retryable: bool
) -> None:
    with H2Peer(socket_path, shape, status=status, message="from the peer"):
        err = failure(socket_path)
    assert (err.code, err.retryable) == (code, retryable)
    assert "from the peer" in str(err)


def test_grpc_message_is_percent_decoded(socket_path: Path) -> None:
    with H2Peer(socket_path, "trailers-only", status=13, message="token expired: %C3%BCber 100%25 %zz"):
        err = failure(socket_path)
    assert str(err) == "INTERNAL: token expired: über 100% %zz"


def test_a_reset_in_the_message_keeps_the_call_retryable(socket_path: Path) -> None:
    with H2Peer(socket_path, "status", status=13, message="recvmsg:Connection reset by peer"):
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("INTERNAL", True)


@pytest.mark.parametrize(
    ("http", "code", "retryable"),
    [
        (503, "UNAVAILABLE", True),
        (429, "UNAVAILABLE", True),
        (502, "UNAVAILABLE", True),
        (401, "UNAUTHENTICATED", False),
        (403, "PERMISSION_DENIED", False),
        (404, "UNIMPLEMENTED", False),
        (400, "INTERNAL", False),
        (500, "UNKNOWN", False),
    ],
)
def test_an_http_error_status_maps_to_a_grpc_code(socket_path: Path, http: int, code: str, retryable: bool) -> None:
    with H2Peer(socket_path, "http", http=http):
        err = failure(socket_path)
    assert (err.code, err.retryable) == (code, retryable)


def test_a_close_mid_stream_is_unavailable(socket_path: Path) -> None:
    with H2Peer(socket_path, "close-mid-stream"):
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("UNAVAILABLE", True)


def test_a_peer_that_never_answers_is_a_deadline(socket_path: Path) -> None:
    with H2Peer(socket_path, "silent") as peer:
        err = failure(socket_path, timeout=0.5)
    assert (err.code, err.retryable) == ("DEADLINE_EXCEEDED", True)
    assert len(peer.requests) == 1  # the request arrived; the answer did not


def test_an_oversized_answer_is_cut_off(socket_path: Path) -> None:
    with H2Peer(socket_path, "oversized", size=4 * 1024 * 1024 + 1):  # over grpcio's default 4 MiB too
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("RESOURCE_EXHAUSTED", False)


def test_an_oversized_header_list_is_refused(socket_path: Path) -> None:
    with H2Peer(socket_path, "huge-header", size=64 * 1024):
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("RESOURCE_EXHAUSTED", False)


@pytest.mark.parametrize(("reset", "code", "retryable"), [(7, "UNAVAILABLE", True), (8, "CANCELLED", False)])
def test_a_reset_stream(socket_path: Path, reset: int, code: str, retryable: bool) -> None:
    with H2Peer(socket_path, "reset", reset=reset):
        err = failure(socket_path)
    assert (err.code, err.retryable) == (code, retryable)


def test_a_goaway_before_the_stream_is_unavailable(socket_path: Path) -> None:
    with H2Peer(socket_path, "goaway"):
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("UNAVAILABLE", True)


def test_a_graceful_goaway_before_the_answer_is_retried(socket_path: Path) -> None:
    """A server shutting down answers the streams it took; h2 cannot read that answer (python-hyper/h2#1181), so
    the call is retried where grpcio would have read it: a retryable failure, never a rejection."""
    with H2Peer(socket_path, "graceful-goaway") as peer:
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("UNAVAILABLE", True)
    assert len(peer.requests) == 1


@pytest.mark.parametrize(
    ("status", "code", "detail"),
    [
        ("²".encode(), "INTERNAL", None),  # a digit to str.isdigit, not to int()
        (b"abc", "INTERNAL", None),
        (b"99", "UNKNOWN", "UNKNOWN: \xffA"),  # a number no code has
        (b"2", "UNKNOWN", "UNKNOWN: \xffA"),
    ],
)
def test_header_bytes_that_are_not_a_status_or_not_utf8(
    socket_path: Path, status: bytes, code: str, detail: str | None
) -> None:
    """What grpcio makes of them (a grpc-message that is no UTF-8 read as latin-1), not an exception the reconciler
    does not expect."""
    with H2Peer(socket_path, "trailers-only", status=status, message=b"\xff%41"):
        err = failure(socket_path)
    assert (err.code, err.retryable) == (code, False)
    if detail is not None:
        assert str(err) == detail


def test_a_socket_nobody_listens_on_is_unavailable(socket_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))  # the file exists; connecting is refused
    try:
        err = failure(socket_path)
    finally:
        stale.close()
    assert (err.code, err.retryable) == ("UNAVAILABLE", True)


def test_a_real_grpc_server_percent_encodes_and_we_decode(socket_path: Path) -> None:
    """grpcio's own encoding of a non-ASCII status message, as the platform-connector's gRPC stack would send it."""

    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> empty_pb2.Empty:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"événement {request.events[0].checkName}: 100% ; ok")

    handler = grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=pb.HealthEvents.FromString, response_serializer=empty_pb2.Empty.SerializeToString
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    service, method = METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    try:
        err = failure(socket_path)
    finally:
        server.stop(None).wait(5)
    assert str(err) == "FAILED_PRECONDITION: événement NvdaemonGpuXidError: 100% ; ok"
    assert not err.retryable
