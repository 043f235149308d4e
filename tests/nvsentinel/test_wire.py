"""The one gRPC call on the wire, against real grpcio servers (tests/nvsentinel/grpcpeer.py): what the request looks
like, which failure ``classify`` names and retries, and the publisher's channel (kept while calls work, made afresh
after a failure, closed with the sink)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nvdaemon.proto import health_event_pb2 as pb
from nvdaemon.sinks.nvsentinel.sink import GrpcPublisher, classify
from nvdaemon.sinks.nvsentinel.wire import MAX_RESPONSE_BYTES, SendError
from tests.nvsentinel.conftest import TOKEN
from tests.nvsentinel.grpcpeer import Handle, peer

REQUEST = pb.HealthEvents(
    version=1,
    events=[pb.HealthEvent(version=1, agent="nvdaemon", checkName="NvdaemonGpuXidError", nodeName="node-a")],
)


def failure(socket_path: Path, token_path: str = "", timeout: float = 5.0) -> SendError:
    """What the reconciler would count for one call to the peer on ``socket_path``."""
    publisher = GrpcPublisher(str(socket_path), token_path, timeout)
    try:
        publisher.send(REQUEST)
    except Exception as exc:
        return classify(exc)
    finally:
        publisher.close()
    raise AssertionError("the call succeeded")


def aborting(code: grpc.StatusCode, message: str) -> Handle:
    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        context.abort(code, message)

    return handle


def test_the_request_is_the_health_events_message_with_the_token(socket_path: Path, token_file: Path) -> None:
    with peer(socket_path) as p:
        GrpcPublisher(str(socket_path), str(token_file), 5.0).send(REQUEST)
        GrpcPublisher(str(socket_path), "", 5.0).send(REQUEST)
    (metadata, request), (untokened, _) = p.requests
    assert request == REQUEST
    assert metadata["authorization"] == f"Bearer {TOKEN}"
    assert "authorization" not in untokened


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (grpc.StatusCode.UNAUTHENTICATED, False),
        (grpc.StatusCode.PERMISSION_DENIED, False),
        (grpc.StatusCode.INVALID_ARGUMENT, False),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, False),
        (grpc.StatusCode.FAILED_PRECONDITION, False),
        (grpc.StatusCode.UNIMPLEMENTED, False),
        (grpc.StatusCode.INTERNAL, False),
        (grpc.StatusCode.UNKNOWN, False),
        (grpc.StatusCode.UNAVAILABLE, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True),
    ],
)
def test_each_status_is_named_and_only_unavailable_and_deadline_are_retried(
    socket_path: Path, status: grpc.StatusCode, retryable: bool
) -> None:
    with peer(socket_path, aborting(status, "from the peer")):
        err = failure(socket_path)
    assert (err.code, err.retryable) == (status.name, retryable)
    assert str(err) == f"{status.name}: from the peer"


def test_a_non_ascii_status_message_is_read_as_sent(socket_path: Path) -> None:
    """grpcio percent-encodes it on the wire, as the platform-connector's gRPC stack would."""
    with peer(socket_path, aborting(grpc.StatusCode.FAILED_PRECONDITION, "événement: 100% ; ok")):
        err = failure(socket_path)
    assert str(err) == "FAILED_PRECONDITION: événement: 100% ; ok" and not err.retryable


def test_a_reset_in_the_message_keeps_the_call_retryable(socket_path: Path) -> None:
    with peer(socket_path, aborting(grpc.StatusCode.INTERNAL, "recvmsg:Connection reset by peer")):
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("INTERNAL", True)


def test_a_socket_nobody_listens_on_is_unavailable(socket_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))  # the file exists; connecting is refused
    try:
        err = failure(socket_path)
    finally:
        stale.close()
    assert (err.code, err.retryable) == ("UNAVAILABLE", True)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # a handler still waiting returns, so the server can stop


def test_a_peer_that_never_answers_is_a_deadline(socket_path: Path, release: threading.Event) -> None:
    def silent(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        release.wait(30)
        return b""

    with peer(socket_path, silent) as p:
        err = failure(socket_path, timeout=0.5)
        release.set()
    assert (err.code, err.retryable) == ("DEADLINE_EXCEEDED", True)
    assert p.calls() == 1  # the request arrived; the answer did not


def test_an_oversized_answer_is_refused_unread(socket_path: Path) -> None:
    """The answer is google.protobuf.Empty: more than MAX_RESPONSE_BYTES is not read (grpcio's limit would be 4 MiB)."""
    field = b"a" * MAX_RESPONSE_BYTES
    big = b"\x0a" + bytes([0x80, 0x80, 0x04]) + field  # field 1, 65,536 bytes: unknown to Empty, valid protobuf
    with peer(socket_path, lambda request, context: big):
        err = failure(socket_path)
    assert (err.code, err.retryable) == ("RESOURCE_EXHAUSTED", False)


# ---- the channel ----------------------------------------------------------------------------------------------------
def test_one_channel_while_calls_work_a_new_one_after_a_failure(socket_path: Path) -> None:
    answers = [None, grpc.StatusCode.UNAVAILABLE, None]

    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        code = answers.pop(0)
        if code is not None:
            context.abort(code, "not now")
        return b""

    publisher = GrpcPublisher(str(socket_path), "", 5.0)
    with peer(socket_path, handle):
        publisher.send(REQUEST)
        first = publisher._channel
        with pytest.raises(Exception) as failed:
            publisher.send(REQUEST)
        assert classify(failed.value).code == "UNAVAILABLE"
        assert publisher._channel is None  # closed: the next attempt connects afresh
        publisher.send(REQUEST)
        assert publisher._channel is not None and publisher._channel is not first
    publisher.close()


def test_a_restarted_platform_connector_is_reached_at_once(socket_path: Path) -> None:
    publisher = GrpcPublisher(str(socket_path), "", 5.0)
    try:
        with peer(socket_path):
            publisher.send(REQUEST)
        with peer(socket_path) as again:  # a new server, a new socket at the same path
            publisher.send(REQUEST)
        assert again.calls() == 1
    finally:
        publisher.close()


def test_close_ends_a_call_in_flight_and_every_later_one(socket_path: Path, release: threading.Event) -> None:
    """The sink replaced or stopped while a call waits in an abandoned worker thread: it ends CANCELLED."""
    arrived = threading.Event()

    def hang(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        arrived.set()
        release.wait(30)
        return b""

    publisher = GrpcPublisher(str(socket_path), "", 30.0)
    errors: list[SendError] = []

    def call() -> None:
        try:
            publisher.send(REQUEST)
        except Exception as exc:
            errors.append(classify(exc))

    with peer(socket_path, hang):
        caller = threading.Thread(target=call)
        caller.start()
        assert arrived.wait(10)
        publisher.close()
        caller.join(10)
        release.set()
        assert [e.code for e in errors] == ["CANCELLED"]
        with pytest.raises(Exception) as later:
            publisher.send(REQUEST)
        assert classify(later.value).code == "CANCELLED"
