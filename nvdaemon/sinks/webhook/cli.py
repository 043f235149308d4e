"""``nvdaemon spool list|retry`` (on the local stateDir's spool.db) and ``nvdaemon webhook test URL``.

Both work without a running agent; ``spool retry`` is safe while one runs (sqlite WAL; the agent's sender re-reads
the spool within a few seconds). Nothing here prints a secret or a full URL of a configured endpoint. A damaged or
unreadable spool is one line on stderr and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from nvdaemon.config import LoadedConfig
from nvdaemon.model import Event, Phase, Severity, new_event_id
from nvdaemon.sinks import cloudevent
from nvdaemon.sinks.webhook import signing
from nvdaemon.sinks.webhook import url as webhook_url

# The spool (sqlite3) and httpx are imported where a command uses them: `nvdaemon run` builds this module's parsers,
# and an agent without a webhook or history never loads either.
if TYPE_CHECKING:
    from nvdaemon.sinks.webhook.spool import SpoolDB


class SpoolUnusable(Exception):
    """The spool file cannot be read or written; the message says why, in one line."""


def _open(loaded: LoadedConfig) -> SpoolDB | None:
    from nvdaemon.sinks.webhook.spool import FILE, SpoolDB

    path = loaded.state_dir / FILE
    if not path.exists():
        print(f"no spool at {path}", file=sys.stderr)
        return None
    return SpoolDB(path)


@contextlib.contextmanager
def _unusable(loaded: LoadedConfig) -> Iterator[None]:
    """Turn what a damaged or unreadable spool raises into ``SpoolUnusable`` with one clear line."""
    import sqlite3

    from nvdaemon.sinks.webhook.spool import FILE
    from nvdaemon.sinks.webhook.spool_io import classify, reason

    path = loaded.state_dir / FILE
    try:
        yield
    except (sqlite3.Error, OSError) as exc:
        kind = classify(exc)
        if kind is None:
            raise
        why = reason(exc)
        if kind == "corrupt":
            msg = f"{path} is damaged ({why}); a running agent moves it aside (.corrupt-<time>) and starts a fresh one"
        else:
            msg = f"{path} cannot be read or written ({why})"
        raise SpoolUnusable(msg) from exc


def spool_command(loaded: LoadedConfig, command: Callable[[LoadedConfig], int]) -> int:
    try:
        with _unusable(loaded):
            return command(loaded)
    except SpoolUnusable as exc:
        print(f"nvdaemon spool: {exc}", file=sys.stderr)
        return 2


def spool_list(loaded: LoadedConfig) -> int:
    from nvdaemon.sinks.spool_clock import system_clock
    from nvdaemon.sinks.webhook.spool import DEAD

    db = _open(loaded)
    if db is None:
        return 0
    try:
        rows = db.rows()
        now, clock = time.time(), system_clock()
        print(f"{'EVENT ID':36}  {'ENDPOINT':28} {'STATE':8} {'SEV':8} {'TRIES':>5} {'AGE':>8}  SUBJECT  LAST ERROR")
        for r in rows:
            try:
                ev = msgspec.json.decode(r.body, type=Event)
                subject = f"{ev.device}/{ev.condition} {ev.phase.value}"
            except msgspec.DecodeError:
                subject = "<undecodable>"
            state = f"dead:{r.dead_reason}" if r.state == DEAD else "pending"
            sev = Severity(r.severity).label if r.severity in {int(s) for s in Severity} else str(r.severity)
            age = f"{r.age(clock, now):.0f}s"  # what maxAgeHours is compared with (nvdaemon.sinks.spool_clock)
            print(
                f"{r.event_id:36}  {r.endpoint:28} {state:8} {sev:8} {r.attempts:>5} {age:>8}  {subject}  "
                f"{r.last_error or ''}"
            )
        pending = sum(1 for r in rows if r.state != DEAD)
        print(f"{len(rows)} event(s): {pending} pending, {len(rows) - pending} dead letter(s)")
        for endpoint, at, reason in db.disabled_endpoints():
            print(
                f"endpoint {endpoint} disabled since {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(at))}: {reason}"
            )
    finally:
        db.close()
    return 0


def spool_retry(loaded: LoadedConfig, ids: list[str]) -> int:
    db = _open(loaded)
    if db is None:
        return 1
    try:
        disabled = len(db.disabled_endpoints())
        n = db.retry(ids)
    finally:
        db.close()
    print(f"{n} dead letter(s) queued for delivery again; {disabled} disabled endpoint(s) enabled")
    return 0


def test_event(node: str) -> Event:
    now = time.time()
    return Event(
        id=new_event_id(now),
        node=node,
        tier="core",
        device="nvdaemon",
        condition="webhook_test",
        phase=Phase.ENTER,
        severity="info",
        seq=0,
        started_at=now,
        detail={"test": True},
    )


def webhook_test(args: argparse.Namespace, node: str) -> int:
    why = webhook_url.check_url(args.url, args.allow_insecure)
    if why:
        print(f"nvdaemon webhook test: {why}", file=sys.stderr)
        return 2
    keys: list[bytes] = []
    if args.secret_file:
        try:
            lines = Path(args.secret_file).read_text(encoding="utf-8").splitlines()
            keys = [signing.decode_secret(s.strip()) for s in lines if s.strip()]
        except (OSError, signing.SecretError) as exc:
            print(f"nvdaemon webhook test: --secret-file: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return 2
    event = test_event(node)
    headers, body = cloudevent.encode(event, args.mode)
    headers |= signing.sign_headers(keys, event.id, int(time.time()), body)
    import httpx

    try:
        with httpx.Client(timeout=args.timeout, follow_redirects=False) as client:
            resp = client.post(args.url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        print(f"nvdaemon webhook test: {type(exc).__name__}: {webhook_url.redact(str(exc), args.url)}", file=sys.stderr)
        return 1
    print(f"sent {event.id} ({args.mode}, {'signed with ' + str(len(keys)) + ' key(s)' if keys else 'unsigned'})")
    print(f"HTTP {resp.status_code} {resp.reason_phrase}")
    for name, value in resp.headers.items():
        print(f"{name}: {value}")
    print()
    print(resp.text)
    return 0 if resp.is_success else 1


COMMANDS = ("spool", "webhook")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    spool = sub.add_parser("spool", help="inspect or re-queue the local webhook spool (stateDir/spool.db)")
    ssub = spool.add_subparsers(dest="spool_command", required=True)
    lst = ssub.add_parser("list", help="list spooled events: pending and dead letters")
    lst.add_argument("--config", help="config file naming stateDir (default: the embedded default)")
    retry = ssub.add_parser("retry", help="queue dead letters again (all, or the given event ids); enable endpoints")
    retry.add_argument("--config", help="config file naming stateDir (default: the embedded default)")
    retry.add_argument("ids", nargs="*", metavar="ID")
    hook = sub.add_parser("webhook", help="webhook tools")
    hsub = hook.add_subparsers(dest="webhook_command", required=True)
    test = hsub.add_parser("test", help="send one signed test event to URL and print the response")
    test.add_argument("url")
    test.add_argument("--secret-file", help="file with the secret(s), one per line (whsec_... or raw)")
    test.add_argument("--mode", choices=["structured", "binary"], default="structured")
    test.add_argument("--timeout", type=float, default=15.0)
    test.add_argument("--allow-insecure", action="store_true", help="allow http:// to a non-loopback host")
    test.add_argument("--node", default="", help="node name in the event (default: $NODE_NAME, else the hostname)")


def main(args: argparse.Namespace, load: Callable[[str | None], LoadedConfig | None]) -> int:
    if args.command == "webhook":
        node = args.node or os.environ.get("NODE_NAME") or socket.gethostname()
        return webhook_test(args, node)
    loaded = load(args.config)
    if loaded is None:
        return 2
    if args.spool_command == "list":
        return spool_command(loaded, spool_list)
    return spool_command(loaded, lambda cfg: spool_retry(cfg, args.ids))
