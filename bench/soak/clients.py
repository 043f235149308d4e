"""The soak's ``/v1/events`` websocket clients.

- ``Reader``: reads every message; when the connection ends (agent killed, 1013, or its own ``hold`` elapsed) it
  reconnects with ``since=<last id>``, as ``nvdaemon tail`` does. It records each event id with the connection it
  came on, close codes, and ``unknown_cursor`` control messages. A ``slow`` reader has tiny socket buffers and
  pauses after each message, so the agent's sends to it block (and it may be cut with 1013, then resume).
- ``Staller``: upgrades with a tiny receive buffer and then never reads. The agent must cut it (1013, counted as
  ``nodevitals_stream_disconnects_total{reason="slow"}``) without the engine or the other clients waiting. After the
  cut is counted, it reads what is left on its socket to see how the connection ended (a close frame, or EOF).
"""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trio
import trio_websocket

from nvdaemon.server.stream_routes import CLOSE_SEND_SECONDS

EVENT_TYPE = "com.nodevitals.hw.event.v1"


@dataclass
class Reader:
    name: str
    port: Callable[[], int]
    hold: tuple[float, float] | None = None  # disconnect on its own after a random time in this range
    slow: bool = False  # tiny socket buffers and a pause per message, so the agent's sends to it block
    rng: random.Random = field(default_factory=random.Random)
    received: list[tuple[int, str]] = field(default_factory=list)  # (connection number, event id)
    connections: int = 0
    close_codes: list[int | None] = field(default_factory=list)
    unknown_cursor: list[int] = field(default_factory=list)  # connection numbers that got the control message
    last_id: str | None = None

    async def run(self) -> None:
        while True:
            resource = f"/v1/events?since={self.last_id}" if self.last_id else "/v1/events?replay=0"
            async with trio.open_nursery() as nursery:
                try:
                    with trio.fail_after(5):
                        if self.slow:
                            stream = trio.SocketStream(await small_socket(self.port()))
                            ws = await trio_websocket.wrap_client_stream(nursery, stream, "127.0.0.1", resource)
                        else:
                            url = f"ws://127.0.0.1:{self.port()}{resource}"
                            ws = await trio_websocket.connect_websocket_url(nursery, url)
                    try:
                        await self._read(ws)
                    finally:
                        with trio.move_on_after(2):
                            await ws.aclose()
                except trio_websocket.ConnectionClosed as exc:
                    self.close_codes.append(exc.reason.code if exc.reason else None)
                except (trio_websocket.HandshakeError, OSError, trio.TooSlowError):
                    pass  # agent down or restarting
                nursery.cancel_scope.cancel()
            await trio.sleep(0.2)

    async def _read(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.connections += 1
        conn = self.connections
        limit = self.rng.uniform(*self.hold) if self.hold else float("inf")
        with trio.move_on_after(limit):
            while True:
                self._note(conn, await ws.get_message())
                if self.slow:
                    await trio.sleep(0.002)  # slower than a burst arrives: the agent's sends block

    def _note(self, conn: int, message: str | bytes) -> None:
        doc = json.loads(message)
        if doc.get("type") == EVENT_TYPE:
            self.received.append((conn, doc["id"]))
            self.last_id = doc["id"]
        elif doc.get("status") == "unknown_cursor":
            self.unknown_cursor.append(conn)


@dataclass
class StallEpisode:
    kicked: bool = False  # the agent counted a slow disconnect (1013) while this client was connected
    prompt: bool = False  # ... and began to read soon enough (``READ_BY_SECONDS``) that the close frame must be there
    read_after: float = 0.0  # seconds from the last poll before the cut to the first read: at least the cut's age then
    dropped: bool = False  # the agent's side of the connection is gone (kicked, or cut by TCP_USER_TIMEOUT)
    ending: str = "open"  # what the client read at the end: close:<code>, eof, reset, or open (nothing)
    frames: str = ""  # what the bytes read held, for a missing close frame: see ``frame_summary``
    agent_restarted: bool = False


def server_side_open(agent_port: int, client_port: int) -> bool:
    """Whether the agent still holds its end of our connection (``/proc/net/tcp``: same network namespace).
    TCP_USER_TIMEOUT drops a connection without telling the peer, so the client alone cannot see that."""
    local, remote = f"0100007F:{agent_port:04X}", f"0100007F:{client_port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        # ESTABLISHED or CLOSE_WAIT: the agent has not closed it. After its close() the kernel keeps the socket a
        # while on its own (FIN_WAIT1/2, TIME_WAIT, ...): no longer the agent's.
        if fields[1] == local and fields[2] == remote and fields[3] in ("01", "08"):
            return True
    return False


async def small_socket(port: int) -> trio.socket.SocketType:
    """A connected socket with a tiny receive buffer and a small MSS. On loopback the MSS is ~64 KiB and the kernel
    sizes the agent's send buffer from it (about 1 MiB), so a client that reads slowly or not at all would take
    thousands of events to fill it; advertising 536 bytes keeps it at a few dozen KiB, as on a real network."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    try:
        await sock.connect(("127.0.0.1", port))
    except BaseException:
        sock.close()
        raise
    return sock


async def handshake(port: int) -> trio.socket.SocketType:
    """A websocket upgrade on a ``small_socket``; nothing of the first frame is consumed."""
    sock = await small_socket(port)
    try:
        head = await _upgrade(sock, port)
    except BaseException:
        sock.close()
        raise
    if not head.startswith(b"HTTP/1.1 101"):
        sock.close()
        raise OSError(f"no upgrade: {head.splitlines()[0]!r}")
    return sock


async def _upgrade(sock: trio.socket.SocketType, port: int) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await sock.send(request.encode())
    head = b""
    with trio.fail_after(5):
        while b"\r\n\r\n" not in head:
            chunk = await sock.recv(1)  # byte by byte: the response ends where the first frame starts
            if not chunk:
                break
            head += chunk
    return head


def _frames(data: bytes) -> Iterator[tuple[int, bytes, int]]:
    """(opcode, payload, end offset) of each of the server's (unmasked) frames in ``data``; the last one's payload
    may be cut short (its end then lies past the data). Stops where a frame's header itself is incomplete."""
    i = 0
    while i + 2 <= len(data):
        opcode, length = data[i] & 0x0F, data[i + 1] & 0x7F
        i += 2
        if length == 126:
            if i + 2 > len(data):
                return
            (length,) = struct.unpack("!H", data[i : i + 2])
            i += 2
        elif length == 127:
            if i + 8 > len(data):
                return
            (length,) = struct.unpack("!Q", data[i : i + 8])
            i += 8
        yield opcode, data[i : i + length], i + length
        i += length


def frame_summary(data: bytes) -> str:
    """How the server's bytes parse as frames: their count, the opcodes seen, and whether they end on a frame
    boundary (a cut inside a frame means the connection ended in the middle of a write)."""
    count = end = 0
    opcodes: set[int] = set()
    cut = False
    for opcode, _, stop in _frames(data):
        if stop > len(data):
            cut = True
            break
        opcodes.add(opcode)
        count, end = count + 1, stop
    cut = cut or len(data) - end >= 2  # a header began whose extended length is cut short
    head = f"{len(data)} bytes, {count} whole frames (opcodes {sorted(opcodes)})"
    if cut:
        return f"{head}, then one cut short"
    return f"{head}, ending on {'a frame boundary' if end == len(data) else f'{len(data) - end} stray bytes'}"


def close_code(data: bytes) -> str | None:
    """``close:<code>`` for the first close frame, None when there is none."""
    for opcode, payload, _ in _frames(data):
        if opcode == 0x8:
            return f"close:{struct.unpack('!H', payload[:2])[0]}" if len(payload) >= 2 else "close:none"
    return None


ATTRIBUTION_SECONDS = 1.5  # how long a reader's own 1013 close may take to be seen after the agent counted it
# A kicked client that starts to read within this long of the cut must find the close frame: the agent gives it
# CLOSE_SEND_SECONDS to go out, and draining what the socket holds takes milliseconds; the rest is margin.
READ_BY_SECONDS = CLOSE_SEND_SECONDS - 0.5


async def stall(
    port: int,
    slow_count: Callable[[], Awaitable[float | None]],
    provoke: Callable[[], None],
    patience: float,
    others_cut: Callable[[], int] = lambda: 0,
    kills: Callable[[], int] = lambda: 0,
) -> StallEpisode:
    """One episode: connect, never read, provoke a burst of events and wait (up to ``patience``) until the agent
    counts this client as slow (1013) or drops it otherwise. Once it is counted, read the socket to its end at once:
    the agent gives its close frame ``CLOSE_SEND_SECONDS`` (5 s) to go out, so the frame must be there.

    The agent's count is one for all its clients, and a slow reader can be cut (1013) meanwhile: ``others_cut`` is
    how many 1013 closes the other clients have seen. A rise of the count that their closes account for, within
    ATTRIBUTION_SECONDS, is theirs, not this client's (without this, a reader's cut under load was taken for this
    client's, and its close frame then looked missing). ``kills`` counts the SIGKILLs the soak has sent: one sent
    before this client has read to the end ends the episode as the agent's restart (the dying agent's kernel sends
    what the socket held, a frame cut short, then end of file)."""
    episode = StallEpisode()
    killed = kills()
    before = await slow_count()
    if before is None:
        episode.agent_restarted = True
        return episode
    sock = await handshake(port)
    with sock:
        client_port = sock.getsockname()[1]
        theirs = others_cut()
        provoke()
        # The cut comes after the agent answered the last poll that did not show it, so after that poll was sent:
        # the time from then to the first read bounds how old the cut is when this client reads. Under load (the
        # full suite on two CPUs) the poll and the attribution wait can take longer than the agent's 5 s.
        asked = trio.current_time()
        with trio.move_on_after(patience):
            while True:
                await trio.sleep(0.5)
                polled = trio.current_time()
                now = await slow_count()
                if now is None or now < before:
                    episode.agent_restarted = True
                    return episode
                if now > before:
                    for _ in range(round(ATTRIBUTION_SECONDS / 0.05)):
                        if others_cut() - theirs >= now - before:
                            break
                        await trio.sleep(0.05)
                    if others_cut() - theirs >= now - before:  # every new cut was another client's
                        before, theirs, asked = now, others_cut(), polled
                        continue
                    episode.kicked = True
                    episode.read_after = trio.current_time() - asked
                    episode.prompt = episode.read_after < READ_BY_SECONDS
                    break
                if not server_side_open(port, client_port):
                    break
                asked = polled
        data = b""
        with trio.move_on_after(10):
            while True:
                try:
                    chunk = await sock.recv(65536)
                except ConnectionResetError:
                    episode.ending = "reset"
                    break
                if not chunk:
                    episode.ending = "eof"
                    break
                data += chunk
        if kills() != killed:
            episode.agent_restarted = True
            return episode
        code = close_code(data)
        if code is not None:
            episode.ending = code
        else:
            episode.frames = frame_summary(data)
        for _ in range(30):  # the agent lets go of it within 15 s
            episode.dropped = not server_side_open(port, client_port)
            if episode.dropped:
                break
            await trio.sleep(0.5)
    return episode
