"""What a reload checks before it changes anything (``Agent.reload`` applies the result, or keeps the running config).

Reads the config file (``load_config``: at most 1 MiB), runs the host checks of ``preflight`` (binds the listen
address if it changed, reads the token files), compiles the rules, and, when the new rules retire conditions that
are active, writes a probe file of the engine state's size to stateDir (``PROBE_FILE``, removed at once): the EXIT
events of those conditions cannot be taken back once published, so the state write after them must not be the
first to find the disk full or read-only. Every failure is an exception; nothing here touches the running agent.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import trio

from nvdaemon import engine
from nvdaemon.config import ConfigError, LoadedConfig
from nvdaemon.configload import load_config
from nvdaemon.preflight import preflight
from nvdaemon.statefile import atomic_write

log = logging.getLogger(__name__)

PROBE_FILE = ".reload-probe"
Rules = dict[str, list[engine.CompiledRule]]


async def prepare_reload(
    path: str | None, host_root: Path | None, running: LoadedConfig, state: engine.EngineState
) -> tuple[LoadedConfig, Rules]:
    """The new config at ``path`` and its compiled rules, checked against the host and the running ``state``."""
    new = await trio.to_thread.run_sync(lambda: load_config(path, host_root=host_root))
    held = running.config.sinks.metrics.listen_addr  # the running server holds it: it binds by definition
    checks = await trio.to_thread.run_sync(lambda: preflight(new, held_addr=held))
    for issue in checks.warnings:
        log.warning("%s: %s: %s", new.source, issue.path, issue.message)
    if checks.problems:
        raise ConfigError(new.source, checks.problems)
    rules = engine.compile_rules(new.config.rules)
    live = {cr.key for crs in rules.values() for cr in crs}
    if any(c.rule_key not in live for c in state.active.values()):
        await trio.to_thread.run_sync(probe_write, new.state_dir, engine.dump_state(state))
    return new, rules


def probe_write(state_dir: Path, data: bytes) -> None:
    """Write ``data`` to ``PROBE_FILE`` in ``state_dir`` as engine state is written, then remove it (and the
    temporary file ``atomic_write`` leaves behind when it fails)."""
    probe = state_dir / PROBE_FILE
    try:
        atomic_write(probe, data)
    finally:
        for leftover in (probe, probe.with_name(f".{probe.name}.tmp")):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)
