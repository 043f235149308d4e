"""``nvdaemon tail [URL]``: follow a running agent's event stream (``/v1/events``), one line per event.

It asks for the last ``--replay`` events on its first connection, then follows live. When the connection drops (the
agent restarted, or closed a slow client) it reconnects with capped exponential backoff and asks for the events
after the last id it printed, so it neither skips nor repeats what the agent still has; ids already printed are
never printed again. If the agent no longer knows that id (it restarted, or the id fell out of its buffer) a note
goes to stderr and everything the agent has is printed. Exit codes: 0 on Ctrl-C (SIGINT) or SIGTERM, 1 when the
agent cannot be reached at start (or refuses: bad token, bad filter).

A signal stops it by cancellation (``Tail.run_until_signalled``), never by a ``KeyboardInterrupt`` raised in
whichever task happens to be running: one raised in trio-websocket's reader task left the connection's close
waiting for a reply that task would have read, up to its 60 s disconnect timeout.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlencode, urlsplit

import trio

from nvdaemon.server.token import read_token

BACKOFF_START = 0.25
BACKOFF_MAX = 10.0
REMEMBERED_IDS = 4096
COLOURS = {"critical": "\033[31;1m", "warning": "\033[33m", "info": "\033[36m"}
GREEN, DIM, RESET = "\033[32m", "\033[2m", "\033[0m"


class TailError(Exception):
    """Ends the command with exit code 1 and this message."""


@dataclass
class Options:
    url: str = "http://127.0.0.1:9847"
    json: bool = False
    severity: str | None = None
    condition: list[str] = field(default_factory=list)
    device: list[str] = field(default_factory=list)
    tier: list[str] = field(default_factory=list)
    token: str | None = None
    replay: int = 10
    colour: bool = False


def stream_url(base: str) -> tuple[str, int, str, bool]:
    """Host, port, path prefix and TLS of the agent URL (http, https, ws or wss)."""
    parts = urlsplit(base if "://" in base else f"http://{base}")
    tls = parts.scheme in ("https", "wss")
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise TailError(f"not an agent URL: {base}")
    return parts.hostname, parts.port or (443 if tls else 80), parts.path.rstrip("/"), tls


def resource(prefix: str, opts: Options, since: str | None) -> str:
    params: list[tuple[str, str]] = []
    if opts.severity:
        params.append(("severity", opts.severity))
    params += [("condition", c) for c in opts.condition]
    params += [("device", d) for d in opts.device]
    params += [("tier", t) for t in opts.tier]
    if since is not None:
        params.append(("since", since))
    elif opts.replay:
        params.append(("replay", str(opts.replay)))
    return f"{prefix}/v1/events" + (f"?{urlencode(params)}" if params else "")


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_line(envelope: dict[str, Any], colour: bool) -> str:
    """``time node severity phase condition device value/threshold`` (or ``xid=N description``) from one CloudEvent
    as the stream sends it (``data`` in the Go agent's shape, times RFC 3339)."""
    ev: dict[str, Any] = envelope.get("data") or {}
    severity = str(ev.get("severity", "?"))
    phase = str(ev.get("phase", "?"))
    detail: dict[str, Any] = ev.get("detail") or {}
    if "xid" in detail:
        what = f"xid={detail['xid']}"
        if detail.get("description"):
            what += f" {detail['description']}"
    else:
        what = f"value={_number(detail.get('value'))} threshold={_number(detail.get('threshold'))}"
        if detail.get("reason"):
            what += f" reason={detail['reason']}"
    pods = detail.get("pods")
    # GPU pod attribution: who held the GPU (ns/pod/container, as NVSentinel's message text names them). An entry
    # that is not an object is skipped: a stream's odd event must not end the tail.
    entries = pods if isinstance(pods, list) else []
    names = [f"{p.get('namespace')}/{p.get('pod')}/{p.get('container')}" for p in entries if isinstance(p, dict)]
    if names:
        what += " pods=" + ",".join(names)
    # The envelope's time is the transition's (RFC 3339, UTC): data's ended_at on an EXIT, else its started_at.
    stamp = str(envelope.get("time") or ev.get("ended_at") or ev.get("started_at") or "?")
    sev = f"{severity:<8}"
    ph = f"{phase:<5}"
    if colour:
        stamp = f"{DIM}{stamp}{RESET}"
        sev = f"{COLOURS.get(severity, '')}{sev}{RESET}"
        ph = f"{GREEN}{ph}{RESET}" if phase == "EXIT" else ph
    return f"{stamp} {ev.get('node', '?')} {sev} {ph} {ev.get('condition', '?')} {ev.get('device', '?')} {what}"


class Tail:
    def __init__(self, opts: Options, out: TextIO, err: TextIO) -> None:
        self.opts = opts
        self.out, self.err = out, err
        self.host, self.port, self.prefix, self.tls = stream_url(opts.url)
        self.last_id: str | None = None
        self.printed: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.connections = 0

    def note(self, text: str) -> None:
        print(f"nvdaemon tail: {text}", file=self.err, flush=True)

    async def run(self) -> None:
        # here, not at the top: `nvdaemon run` builds this command's parser and never follows a stream
        import trio_websocket

        backoff = BACKOFF_START
        while True:
            before = self.connections
            try:
                await self.follow()
                reason = "connection closed"
            except trio_websocket.ConnectionRejected as exc:
                status = exc.status_code
                if status in (400, 401, 403, 404) or (status == 503 and not self.connections):
                    body = (exc.body or b"").decode(errors="replace").strip()
                    raise TailError(f"{self.opts.url}: the agent refused the stream (HTTP {status}) {body}") from None
                reason = f"refused with HTTP {status}"
            except trio_websocket.ConnectionClosed as exc:
                close = exc.reason
                reason = f"closed by the agent ({close.code} {close.name})" if close else "connection closed"
            except (OSError, trio_websocket.HandshakeError) as exc:
                why = str(exc) or str(exc.__cause__ or exc.__context__ or type(exc).__name__)
                if not self.connections:
                    raise TailError(f"cannot reach the agent at {self.opts.url}: {why}") from None
                reason = f"connection lost ({why})"
            if self.connections > before:  # it had connected: start the backoff over
                backoff = BACKOFF_START
            self.note(f"{reason}; reconnecting in {backoff:.1f}s")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    async def run_until_signalled(self) -> None:
        """``run`` until SIGINT or SIGTERM arrives (then cancelled: the open connection is dropped at once) or it
        fails (``TailError``, or the output went away: ``BrokenPipeError``), which is raised here as it is."""
        failed: list[Exception] = []
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def follow_all() -> None:
                    try:
                        await self.run()
                    except (TailError, BrokenPipeError) as exc:
                        failed.append(exc)
                    nursery.cancel_scope.cancel()

                nursery.start_soon(follow_all)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break
        if failed:
            raise failed[0]

    async def follow(self) -> None:
        import trio_websocket

        headers = [(b"authorization", f"Bearer {self.opts.token}".encode())] if self.opts.token else None
        path = resource(self.prefix, self.opts, self.last_id)
        async with trio_websocket.open_websocket(
            self.host, self.port, path, use_ssl=self.tls, extra_headers=headers, connect_timeout=10
        ) as ws:
            if self.connections:
                self.note("reconnected" + (f", resuming after {self.last_id}" if self.last_id else ""))
            self.connections += 1
            while True:
                message = await ws.get_message()
                self.handle(json.loads(message))

    def handle(self, doc: dict[str, Any]) -> None:
        kind = doc.get("type")
        if kind == "ping":
            return
        if kind == "control":
            if doc.get("status") == "unknown_cursor" and self.last_id is not None:
                self.note(
                    f"the agent no longer has event {self.last_id} (it restarted, or the id left its buffer): "
                    "events in between may be missing; printing everything it has"
                )
            return
        event_id = str(doc.get("id", ""))
        if event_id in self.printed:
            return
        self.printed[event_id] = None
        if len(self.printed) > REMEMBERED_IDS:
            self.printed.popitem(last=False)
        line = json.dumps(doc, separators=(",", ":")) if self.opts.json else format_line(doc, self.opts.colour)
        print(line, file=self.out, flush=True)
        self.last_id = event_id


def use_colour(out: TextIO) -> bool:
    return out.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def main(opts: Options, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        tail = Tail(opts, out, err)
        trio.run(tail.run_until_signalled)
    except TailError as exc:
        print(f"nvdaemon tail: {exc}", file=err, flush=True)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `nvdaemon tail | head`
        return 0
    return 0


def add_parser(sub: Any, default_url: str) -> None:
    """``nvdaemon tail`` on the CLI's subparsers."""
    p = sub.add_parser("tail", help="follow a running agent's events, one line each (Ctrl-C to stop)")
    p.add_argument("url", nargs="?", default=default_url, help=f"the agent (default {default_url})")
    p.add_argument("--json", action="store_true", help="print each event's CloudEvent JSON as received")
    p.add_argument("--severity", choices=["info", "warning", "critical"], help="minimum severity")
    p.add_argument("--condition", action="append", default=[], help="only this condition (repeatable)")
    p.add_argument("--device", action="append", default=[], help="only devices matching this glob (repeatable)")
    p.add_argument("--tier", action="append", default=[], help="only this tier (repeatable)")
    p.add_argument("--token-file", help="file holding the API bearer token")
    p.add_argument("-n", "--replay", type=int, default=10, metavar="N", help="start with the last N events (10)")


def cli(args: Any) -> int:
    token = None
    if args.token_file:
        try:
            token = read_token(args.token_file).decode("utf-8", "replace")  # the server's own reader and limits
        except (OSError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            print(f"nvdaemon tail: cannot read --token-file: {why}", file=sys.stderr)
            return 1
    opts = Options(
        url=args.url,
        json=args.json,
        severity=args.severity,
        condition=args.condition,
        device=args.device,
        tier=args.tier,
        token=token,
        replay=max(0, args.replay),
        colour=use_colour(sys.stdout),
    )
    return main(opts)
