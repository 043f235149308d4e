"""Command line: ``nvdaemon run``, ``nvdaemon check-config FILE``, ``nvdaemon state [URL]``,
``nvdaemon spool list|retry``, ``nvdaemon webhook test URL``.

Exit codes: 0 success, 1 runtime failure, 2 bad usage or an invalid config (every error listed on stderr).

The Go agent's command line works too: ``-config FILE`` (also ``-config=FILE``, ``--config FILE``), with or without
``run`` before it, and with no config flag its default ``/etc/nodevitals/config.yaml`` is read when it exists. As the
Go binary had no subcommands, ``nvdaemon`` with no arguments, or with ``run``'s flags first, is ``nvdaemon run``.

``check-config`` and ``run`` check the same things: the file (size, UTF-8, YAML, keys, types and ranges), then what
only the host can tell (``preflight``: the listen address binds, the token files are readable); ``run`` starts
nothing when either finds a problem.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from nvdaemon import __version__, tail
from nvdaemon.config import ConfigError, LoadedConfig
from nvdaemon.configload import load_config
from nvdaemon.preflight import preflight
from nvdaemon.server.token import read_token
from nvdaemon.sinks.webhook import cli as webhook_cli

EXIT_CONFIG = 2
DEFAULT_URL = "http://127.0.0.1:9847"
GO_DEFAULT_CONFIG = Path("/etc/nodevitals/config.yaml")  # the Go agent's -config default; read at each call
TOP_LEVEL_FLAGS = ("-h", "--help", "--version")  # every other leading flag is one of `run`'s (the Go command line)
UNKNOWN_KEY_NOTE = (
    "note: the Go agent ignored unknown keys; nvdaemon rejects them so that a typo cannot silently disable a rule"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nvdaemon",
        description="Node hardware telemetry and events agent.",
        epilog="With no command, or with run's flags first (the Go agent's `nodevitals -config FILE`), runs the agent "
        "as `nvdaemon run` does.",
    )
    p.add_argument("--version", action="version", version=f"nvdaemon {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the agent in the foreground")
    run.add_argument(
        "--config",
        "-config",
        dest="config",
        help=f"YAML config file (default: {GO_DEFAULT_CONFIG} when it exists, else the embedded default: core tier)",
    )
    run.add_argument("--host-root", type=Path, help="read proc/, sys/, dev/ under DIR (a fixture host)")
    run.add_argument("--log-format", choices=["text", "json"], default="text")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    check = sub.add_parser("check-config", help="validate a config file and exit (0 valid, 2 invalid)")
    check.add_argument("file")
    check.add_argument("--host-root", type=Path)
    check.add_argument(
        "--offline",
        action="store_true",
        help="check the file only, not this host (listen address, token files): for a config of another machine",
    )
    state = sub.add_parser(
        "state",
        help="summarize a running agent's status (/v1/status): readiness, tiers, conditions, sinks, recent events",
        description="Exit 0 when the agent answered (a NOT READY agent included: /readyz is the readiness check), "
        "1 when it could not be reached or read.",
    )
    state.add_argument("url", nargs="?", default=DEFAULT_URL)
    state.add_argument("--token-file", help="file holding the API bearer token")
    state.add_argument("--json", action="store_true", help="print the whole /v1/status document as JSON instead")
    webhook_cli.add_parsers(sub)  # spool list|retry, webhook test
    tail.add_parser(sub, DEFAULT_URL)
    return p


def _load(path: str | None, host_root: Path | None) -> LoadedConfig | None:
    try:
        return load_config(path, host_root=host_root)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        if any(issue.message.startswith("unknown key") for issue in exc.issues):
            print(UNKNOWN_KEY_NOTE, file=sys.stderr)
        return None


def config_path(given: str | None, go_default: Path | None = None) -> str | None:
    """The file ``run`` reads: the flag's, else the Go agent's default (``GO_DEFAULT_CONFIG``, looked up at each
    call) when it is a file, else None (the embedded default)."""
    if given is not None:
        return given
    go_default = GO_DEFAULT_CONFIG if go_default is None else go_default
    return str(go_default) if go_default.is_file() else None


def go_command_line(argv: list[str]) -> list[str]:
    """``argv`` with ``run`` put first where the Go binary's command line is given: no arguments at all (the Go
    binary run bare, say by a manifest with no ``args``), or a leading flag other than help and version
    (``-config FILE``). An unknown flag is still a usage error (``unrecognized arguments``, exit 2)."""
    if not argv or (argv[0].startswith("-") and argv[0] not in TOP_LEVEL_FLAGS):
        return ["run", *argv]
    return argv


def _print_warning(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)


def _checked(
    path: str | None, host_root: Path | None, offline: bool = False, warn: Callable[[str], None] = _print_warning
) -> LoadedConfig | None:
    """``_load`` plus the host checks; problems are printed as config errors (None), warnings go to ``warn``."""
    loaded = _load(path, host_root)
    if loaded is None or offline:
        return loaded
    checks = preflight(loaded)
    for issue in checks.warnings:
        warn(f"{loaded.source}: {issue.path}: {issue.message}")
    if checks.problems:
        print(ConfigError(loaded.source, checks.problems), file=sys.stderr)
        return None
    return loaded


M_ARENA_MAX = -8  # glibc's mallopt() parameter (malloc.h)
MALLOC_ARENAS = 2


def cap_malloc_arenas() -> bool:
    """At most MALLOC_ARENAS glibc malloc arenas for the agent's threads (the environment's MALLOC_ARENA_MAX wins).

    glibc gives each thread that allocates its own arena, up to 8 per core, and each keeps the pages it touched: with
    the worker threads of the tier loops and sinks that measured about 0.5 MiB (a one-tier pod) and 1.3-2.4 MiB
    (singlePod) of peak RSS (bench/rss.py). The threads mostly wait on reads, so they rarely contend for an arena.
    Called before any thread starts; False where it did nothing (set in the environment, or not glibc)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_ARENA_MAX, MALLOC_ARENAS))


def raise_nofile() -> tuple[int, int]:
    """The soft RLIMIT_NOFILE raised to the hard limit, as the Go runtime does for node_exporter at start; the limits
    after. The collectors keep a share of it for the pseudo files they hold open (``collectors.heldfiles``) and the
    server the rest for connections: systemd's soft default (1024, hard 524288) would leave a node's sysfs files a
    few hundred. A hard limit that is infinite (or a refusal) leaves the soft one as it was."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard not in (resource.RLIM_INFINITY, soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError):
            return soft, hard
        soft = hard
    return soft, hard


def settle_heap() -> None:
    """Once the agent has started: collect what start-up left behind, then move every object alive (modules, the web
    framework, the config, the collectors) out of the garbage collector's reach (``gc.freeze``). Each tick allocates
    a few thousand objects, and every collection of the oldest generation walked the ~90,000 start-up objects that
    never die: garbage collection took 3.5-4.1 ms of a core tick's ~20 ms with the node_* surface on
    fixtures/hosts/gpunode, 1.7 ms once frozen.
    Frozen objects are never freed, so this runs once, in ``nvdaemon run`` only (not in tests that start agents)."""
    import gc

    gc.collect()
    gc.freeze()


def _run(args: argparse.Namespace) -> int:
    from nvdaemon import logs

    cap_malloc_arenas()
    raise_nofile()

    logs.setup(args.log_format, args.log_level)
    log = logging.getLogger("nvdaemon")
    args.config = config_path(args.config)
    log.info("config: %s", args.config or "the embedded default")
    loaded = _checked(args.config, args.host_root, warn=log.warning)
    if loaded is None:
        return EXIT_CONFIG
    for note in loaded.notes:
        log.info("config: %s", note)
    import trio

    from nvdaemon import shutdown
    from nvdaemon.app import Agent
    from nvdaemon.nvml import NvmlUnavailable

    agent = Agent(loaded, config_path=args.config, host_root=args.host_root)
    agent.after_start = settle_heap
    # Armed by SIGTERM/SIGINT: ends the process shutdownGraceSeconds (and a margin) later if a worker thread stuck
    # in a blocking call keeps trio.run, or the interpreter's exit, from returning (nvdaemon/shutdown.py).
    shutdown.EXIT_GUARD.start()
    try:
        trio.run(agent.run)
    except OSError as exc:
        log.error("cannot run: %s", exc)
        return 1
    except NvmlUnavailable as exc:  # gpu is the only tier and NVML cannot be used
        log.error("cannot run: gpu tier: %s", exc)
        return 1
    return 0


def _state(args: argparse.Namespace) -> int:
    """``nvdaemon state``: GET ``URL/v1/status`` and print its summary (``nvdaemon.state_summary``), or with
    ``--json`` the document itself (indented, keys sorted). 0 once the agent answered, ready or not; 1 otherwise."""
    req = urllib.request.Request(args.url.rstrip("/") + "/v1/status")
    if args.token_file:
        try:
            token = read_token(args.token_file)  # the server's own reader and limits
        except OSError as exc:
            print(f"nvdaemon state: cannot read the token file {args.token_file}: {exc.strerror}", file=sys.stderr)
            return 1
        except ValueError as exc:  # empty or too large; the message names the file, never its content
            print(f"nvdaemon state: {exc}", file=sys.stderr)
            return 1
        req.add_header("Authorization", "Bearer " + token.decode("latin-1"))
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            doc = json.load(resp)
    except (urllib.error.URLError, OSError, ValueError) as exc:  # ValueError: not JSON (not an nvdaemon there)
        print(f"nvdaemon state: {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        print()
        return 0
    from nvdaemon.state_summary import summarize  # this command's only: the agent never loads it

    # Ages are counted on this machine's clock: behind a port-forward, a skewed clock shifts them by the skew.
    sys.stdout.write(summarize(doc, time.time()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = go_command_line(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.command == "run":
        return _run(args)
    if args.command == "check-config":
        loaded = _checked(args.file, args.host_root, offline=args.offline)
        if loaded is None:
            return EXIT_CONFIG
        c = loaded.config
        print(f"{args.file}: ok (node {loaded.node}, tiers {','.join(loaded.tiers)}, {len(c.rules)} rule(s))")
        for note in loaded.notes:  # where this file means something the Go agent would do differently
            print(f"{args.file}: note: {note}")
        return 0
    if args.command == "tail":
        return tail.cli(args)
    if args.command in webhook_cli.COMMANDS:
        return webhook_cli.main(args, lambda path: _load(config_path(path), None))
    return _state(args)
