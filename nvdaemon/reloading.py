"""A config reload: what it checks before it changes anything (``prepare_reload``), then applying the new config or,
when applying fails after all, rolling back to the running one (``Reloads``).

``prepare_reload`` reads the config file (``load_config``: at most 1 MiB), runs the host checks of ``preflight``
(binds the listen address if it changed, reads the token files), compiles the rules, and, when the new rules retire
conditions that are active, writes a probe file of the engine state's size to stateDir (``PROBE_FILE``, removed at
once): the EXIT events of those conditions cannot be taken back once published, so the state write after them must
not be the first to find the disk full or read-only. Every failure is an exception; nothing there touches the
running agent.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from nvdaemon import engine
from nvdaemon.config import ConfigError, LoadedConfig
from nvdaemon.configload import load_config
from nvdaemon.preflight import preflight
from nvdaemon.statefile import atomic_write
from nvdaemon.supervise import describe

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


@dataclass(frozen=True)
class ReloadSteps:
    """What a reload does to the running agent. ``prepare``: the new config and rules, checked (``prepare_reload``)
    and the new listen address held; an exception rejects the reload before anything changed. ``running``: the
    config and rules in force now. ``install``: put a config and its rules in force (conditions of the rules it
    retires EXIT). ``persist``: save the engine state, raising OSError when ``strict`` (its argument) and stateDir
    refuses the write. ``sync_tasks``: start, restart and stop the tasks to match the config in force."""

    prepare: Callable[[], Awaitable[tuple[LoadedConfig, Rules]]]
    running: Callable[[], tuple[LoadedConfig, Rules]]
    install: Callable[[LoadedConfig, Rules], None]
    persist: Callable[[bool], Awaitable[None]]
    sync_tasks: Callable[[], Awaitable[None]]


class Reloads:
    """Applies reloads and counts them: ``applied``, ``rejected`` and whether the last one was applied
    (``nodevitals_config_reloads_total``, ``nodevitals_config_last_reload_successful``). ``note_change`` is called
    at each rejection: /metrics shows the count."""

    def __init__(self, note_change: Callable[[], None]) -> None:
        self._note_change = note_change
        self.applied = 0
        self.rejected = 0
        self.last_ok = True

    async def reload(self, steps: ReloadSteps) -> None:
        """Apply the config ``steps.prepare`` reads, or keep the running one. Never raises (``trio.Cancelled``
        aside). What can fail is tried in ``prepare``, before anything changes. A failure while applying after all
        (a sink that cannot be built, the engine state the disk refuses after the trial, the server's restart) rolls
        back to the running config: its rules, sinks, tier loops and server."""
        try:
            new, rules = await steps.prepare()
        except Exception as exc:
            self.reject(exc)
            return
        running, running_rules = steps.running()
        try:
            steps.install(new, rules)
            await steps.persist(True)
            await steps.sync_tasks()
        except Exception as exc:
            self.reject(exc, applied=True)
            await _roll_back(steps, running, running_rules)
            return
        self.applied += 1
        self.last_ok = True
        log.info("config reloaded from %s", new.source)

    def reject(self, exc: BaseException, applied: bool = False) -> None:
        """Count and log a rejected reload: ``exc`` came from checking the config, or from applying it when
        ``applied`` (a rollback follows)."""
        self.rejected += 1
        self.last_ok = False
        self._note_change()
        if isinstance(exc, ConfigError):
            log.error("reload rejected, keeping the running config:\n%s", exc)
            return
        stage = "while applying it, rolling back" if applied else "keeping the running config"
        # An OSError explains itself; anything else is a bug worth its traceback.
        trace = None if isinstance(exc, OSError) else exc
        log.error("reload failed %s: %s", stage, describe(exc), exc_info=trace)


async def _roll_back(steps: ReloadSteps, loaded: LoadedConfig, rules: Rules) -> None:
    """Back to the running config after a failed apply; conditions the rejected rules entered meanwhile EXIT."""
    steps.install(loaded, rules)
    restore: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("sync_tasks", steps.sync_tasks),
        ("persist_engine", lambda: steps.persist(False)),
    ]
    for name, step in restore:
        try:
            await step()
        except Exception as exc:  # the supervisor keeps retrying what did not start; state is saved next tick
            log.error("rollback: %s failed: %s", name, describe(exc))
