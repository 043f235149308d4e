"""Answers a platform-connector's gRPC stack can give, each against a real grpcio server on a Unix socket
(tests/nvsentinel/grpcpeer.py), through the reconciler: every one ends as grpcio ends it, and the sink retries only
what is retryable, with backoff across ticks too.

- a status message with a trailing space, and an OK answer whose trailer value ends with one;
- a graceful stop (``server.stop(grace)``) while the call is in flight: the call completes OK, once;
- an answer compressed by the server;
- a status sent before a large request was read (RESOURCE_EXHAUSTED, a rejection);
- a regular file or a directory at the socket path: named, skipped, never a send;
- a platform-connector that keeps rejecting a difference, or keeps being unavailable, is not sent it on every tick.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
import trio

from nvdaemon.proto import health_event_pb2 as pb
from tests.nvsentinel.conftest import MakeReconciler
from tests.nvsentinel.grpcpeer import GrpcPeer
from tests.nvsentinel.test_reconciler import HOT, HOT_CHECK, LOAD, LOAD_CHECK, active, sync

FAULT = [active(HOT, 97.0)]


async def one_pass(make_reconciler: MakeReconciler, **settings: object) -> tuple[int, int, dict[str, int]]:
    """A reconciler with one difference to send (no baselines): (acknowledged, pending, errors) after one pass."""
    rec = make_reconciler(healthy_baseline=False, **settings)
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, FAULT)
    return rec.success, rec.pending, dict(rec.errors)


async def test_a_status_message_with_a_trailing_space_is_that_status(
    socket_path: Path, make_reconciler: MakeReconciler
) -> None:
    """``abort(UNAVAILABLE, "store not ready: ")`` is UNAVAILABLE: retried after its delay, then acknowledged."""
    answers = [grpc.StatusCode.UNAVAILABLE]

    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        if answers:
            context.abort(answers.pop(), "store not ready: ")
        return b""

    with GrpcPeer(socket_path, handle) as peer:
        assert await one_pass(make_reconciler) == (1, 0, {"UNAVAILABLE": 1})
    assert peer.calls() == 2


async def test_an_ok_answer_with_a_trailer_ending_in_a_space_is_delivered(
    socket_path: Path, make_reconciler: MakeReconciler
) -> None:
    """Applied by the platform-connector, so acknowledged here: the next pass sends nothing."""

    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata((("x-stored", "stored "),))
        return b""

    with GrpcPeer(socket_path, handle) as peer:
        rec = make_reconciler(healthy_baseline=False)
        await trio.to_thread.run_sync(rec.load)
        await sync(rec, FAULT)
        await sync(rec, FAULT)
    assert (rec.success, rec.pending, dict(rec.errors)) == (1, 0, {})
    assert peer.calls() == 1


def _refused(path: Path) -> bool:
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return True
    return False


async def test_a_graceful_stop_during_the_call_completes_it_once(
    socket_path: Path, make_reconciler: MakeReconciler
) -> None:
    """The server stops with a grace period while it handles the call: it sends GOAWAY, stops listening, and still
    answers the call it took, which is acknowledged without a second send."""
    holder: list[GrpcPeer] = []
    stopped = threading.Event()

    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        server = holder[0].server
        assert server is not None
        server.stop(10)
        while not _refused(socket_path):  # the listener closes as the GOAWAY goes out
            time.sleep(0.01)
        time.sleep(0.2)  # the peer's pace, not the test's: the GOAWAY reaches the client before the answer
        stopped.set()
        return b""

    peer = GrpcPeer(socket_path, handle)
    holder.append(peer.start())
    try:
        assert await one_pass(make_reconciler) == (1, 0, {})
    finally:
        peer.stop()
    assert stopped.is_set() and peer.calls() == 1


async def test_a_compressed_answer_is_read(socket_path: Path, make_reconciler: MakeReconciler) -> None:
    """A server that compresses its answers (gzip); gRPC compresses only what gets smaller, so the answer carries a
    field google.protobuf.Empty does not know (valid protobuf, ignored)."""
    answer = b"\x0a\xe8\x07" + b"a" * 1000  # field 1, 1,000 bytes

    with GrpcPeer(socket_path, lambda request, context: answer, compression=grpc.Compression.Gzip) as peer:
        assert await one_pass(make_reconciler) == (1, 0, {})
    assert peer.calls() == 1


async def test_a_status_before_a_large_request_is_read_is_a_rejection(
    socket_path: Path, make_reconciler: MakeReconciler
) -> None:
    """A request over the server's receive limit, larger than a flow-control window: the server answers before it
    has read it all. RESOURCE_EXHAUSTED, counted, not retried within the pass."""
    options = [("grpc.max_receive_message_length", 64 * 1024)]
    with GrpcPeer(socket_path, options=options) as peer:
        rec = make_reconciler(healthy_baseline=False)
        rec.node = "n" * (1 << 20)  # the node name is in every event: a 1 MiB request
        await trio.to_thread.run_sync(rec.load)
        await sync(rec, FAULT)
    assert (rec.success, rec.pending, dict(rec.errors)) == (0, 1, {"RESOURCE_EXHAUSTED": 1})
    assert peer.calls() == 0  # the handler never saw it


@pytest.mark.parametrize("kind", ["regular file", "directory"])
async def test_a_file_or_directory_at_the_socket_path_is_skipped_and_named(
    socket_path: Path, make_reconciler: MakeReconciler, kind: str
) -> None:
    if kind == "directory":
        socket_path.mkdir()
    else:
        socket_path.touch()
    rec = make_reconciler(healthy_baseline=False)
    await trio.to_thread.run_sync(rec.load)
    await sync(rec, FAULT)
    await sync(rec, FAULT)
    assert (rec.success, rec.skipped, dict(rec.errors), rec.pending) == (0, 2, {}, 1)
    assert rec.state()["socketState"] == f"not a socket: {kind}"
    assert rec.state()["lastError"] == f"socket {socket_path}: not a socket: {kind}"


# ---- backoff across ticks -------------------------------------------------------------------------------------------
TICKS = 60  # one pass per (virtual) second


async def send_ticks(make_reconciler: MakeReconciler, peer: GrpcPeer, **settings: object) -> list[int]:
    """TICKS passes one virtual second apart (retryInitialSeconds 1, x2, no jitter); the ticks in which a send
    reached the peer."""
    rec = make_reconciler(healthy_baseline=False, retry_initial_seconds=1.0, retry_multiplier=2.0, **settings)
    await trio.to_thread.run_sync(rec.load)
    sent_in: list[int] = []
    for tick in range(TICKS):
        before = peer.calls()
        await sync(rec, [active(HOT, 97.0), active(LOAD, 20.0)])
        if peer.calls() > before:
            sent_in.append(tick)
        await trio.sleep(1)
    return sent_in


async def test_a_rejected_difference_is_sent_again_with_a_growing_delay_and_others_still_go(
    socket_path: Path, make_reconciler: MakeReconciler, autojump_clock: trio.testing.MockClock
) -> None:
    """The first rejection is tried again at the next tick; then after 1, 2, 4, ... seconds. The other difference
    is acknowledged at the first tick all the same."""
    rejected: list[str] = []

    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        if request.events[0].checkName == HOT_CHECK:
            rejected.append(HOT_CHECK)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no ")
        return b""

    with GrpcPeer(socket_path, handle) as peer:
        sent_in = await send_ticks(make_reconciler, peer)
    assert sent_in == [0, 1, 2, 4, 8, 16, 32]
    assert len(rejected) == 7 and [r.events[0].checkName for _, r in peer.requests].count(LOAD_CHECK) == 1


async def test_an_unavailable_platform_connector_is_not_sent_to_on_every_tick(
    socket_path: Path, make_reconciler: MakeReconciler, autojump_clock: trio.testing.MockClock
) -> None:
    """Two attempts per pass (1 s apart); once they are spent, every send waits 2, 4, 8, ... seconds (the attempts'
    backoff carried on, at most a minute)."""

    def handle(request: pb.HealthEvents, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNAVAILABLE, "store not ready")

    with GrpcPeer(socket_path, handle) as peer:
        sent_in = await send_ticks(make_reconciler, peer, max_attempts=2)
    # A pass that sends takes 1 s (the delay between its two attempts); then every send waits 2, 4, 8, 16 s.
    assert sent_in == [0, 2, 6, 14, 30]
    assert peer.calls() == 2 * len(sent_in)
