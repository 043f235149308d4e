"""What the agent needs of the kernel-log source: its rules from the config, the condition keys it owns, the task's
fingerprint (a reload restarts it exactly when one of its inputs changed), and building it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from nvdaemon.config import Config, KernelLogConfig
from nvdaemon.engine import EngineState
from nvdaemon.gpu.xid_ledger import XidLedger
from nvdaemon.kmsg.faults import BUILTIN_KEYS
from nvdaemon.kmsg.position import POSITION_FILE
from nvdaemon.kmsg.rules import CompiledKernelRule, compile_rules
from nvdaemon.kmsg.source import TASK_NAME as TASK_NAME  # noqa: PLC0414 (re-export: the agent's task name)
from nvdaemon.kmsg.source import KmsgSource
from nvdaemon.model import Event

if TYPE_CHECKING:
    from nvdaemon.gpu import GpuRuntime

BOOT_ID = "sys/kernel/random/boot_id"  # under procRoot
UPTIME = "uptime"  # under procRoot


def compiled_rules(c: Config) -> list[CompiledKernelRule]:
    return compile_rules(c.kernel_rules, defaults=c.kernel_log.default_rules)


def live_keys(c: Config, rules: list[CompiledKernelRule]) -> set[str]:
    """The condition keys the kernel-log source owns while it is on (off: its conditions EXIT as rule_removed)."""
    if not c.kernel_log.enabled:
        return set()
    return {cr.key for cr in rules} | set(BUILTIN_KEYS)


def configure_ledger(ledger: XidLedger, cfg: KernelLogConfig) -> None:
    ledger.merge_seconds = cfg.xid_merge_seconds
    ledger.repeat_seconds = cfg.xid_repeat_seconds


def fingerprint(c: Config, state_dir: Path) -> tuple[object, ...]:
    rules = msgspec.json.encode(c.kernel_rules)
    return (msgspec.json.encode(c.kernel_log), rules, c.dev_root, c.proc_root, str(state_dir))


def build_source(
    c: Config,
    rules: list[CompiledKernelRule],
    *,
    state_dir: Path,
    node: str,
    state: Callable[[], EngineState],
    emit: Callable[[list[Event]], None],
    ledger: XidLedger,
    persist_engine: Callable[[], Awaitable[None]],
    held_seq: Callable[[], float],
    gpu: GpuRuntime | None,
) -> KmsgSource:
    proc = Path(c.proc_root)
    return KmsgSource(
        c.kernel_log,
        rules,
        path=Path(c.dev_root) / "kmsg",
        position_path=state_dir / POSITION_FILE,
        boot_id_path=proc / BOOT_ID,
        uptime_path=proc / UPTIME,
        node=node,
        state=state,
        emit=emit,
        ledger=ledger,
        persist_engine=persist_engine,
        held_seq=held_seq,
        gpu=gpu,
    )
