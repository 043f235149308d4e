"""The publisher's gRPC channel is open only while calls are due: a pass that sends several differences uses one
channel, and a pass that leaves nothing to send closes it (an idle grpcio channel keeps its polling threads
busy: ``wire.GrpcPublisher.release``). The next difference opens a new one and is delivered."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
import trio

from nvdaemon.sinks.nvsentinel.wire import GrpcPublisher
from tests.nvsentinel.conftest import MakeReconciler
from tests.nvsentinel.grpcpeer import GrpcPeer
from tests.nvsentinel.test_reconciler import HOT, LOAD, active, sync


@pytest.fixture
def channels_opened(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    opened: list[object] = []
    real = grpc.insecure_channel

    def counted(*args: Any, **kwargs: Any) -> grpc.Channel:
        channel = real(*args, **kwargs)
        opened.append(channel)
        return channel

    monkeypatch.setattr(grpc, "insecure_channel", counted)
    return opened


async def test_a_pass_with_nothing_left_closes_the_channel(
    socket_path: Path, make_reconciler: MakeReconciler, channels_opened: list[object]
) -> None:
    with GrpcPeer(socket_path, lambda request, context: b"") as peer:
        rec = make_reconciler(healthy_baseline=False)
        assert isinstance(rec.publisher, GrpcPublisher)
        await trio.to_thread.run_sync(rec.load)
        await sync(rec, [active(HOT, 97.0), active(LOAD, 30.0)])  # two differences, one pass
        assert (peer.calls(), len(channels_opened), rec.pending) == (2, 1, 0)
        assert rec.publisher._channel is None  # released: nothing more to send
        await sync(rec, [active(HOT, 97.0), active(LOAD, 30.0)])  # no difference: no call, no channel
        assert (peer.calls(), len(channels_opened)) == (2, 1)
        await sync(rec, [active(HOT, 97.0)])  # load_high cleared: a new channel for the one call
        assert (peer.calls(), len(channels_opened), rec.pending) == (3, 2, 0)
        assert rec.publisher._channel is None
    assert rec.success == 3
