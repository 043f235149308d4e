"""Host kernel-log rules (``kernelRules``): the built-in set, compiling them, and checking them in a config.

The built-in rules cover node-problem-detector's kernel monitor (``config/kernel-monitor.json`` and
``readonly-monitor.json``: OOM kills, hung tasks, oopses, EXT4 errors, XFS shutdowns, buffer I/O errors, memory read
errors, UEFI CPER hardware errors, read-only remounts) plus NVMe timeouts and controller resets (the kernel's
``drivers/nvme/host/pci.c`` text) and machine checks (``arch/x86/kernel/cpu/mce/core.c``). The patterns are the
kernel's message text; an ``event`` rule raises one event per fault (repeats within its window folded), a
``condition`` rule stays active until ``clearAfterSeconds`` pass without a match, or until a reboot.

Each rule is tried only on messages that contain its literal (``contains``, else the longest literal the pattern
itself requires, found by parsing the pattern): one ``bytes in`` test per rule and record before any regex.
"""

from __future__ import annotations

import hashlib
import importlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from nvdaemon.config import KernelRule
from nvdaemon.configcheck import ConfigIssue
from nvdaemon.gpu.events import LOST_CONDITION, XID_CONDITION
from nvdaemon.gpu.xid_ledger import RECOVERED_CONDITION
from nvdaemon.kmsg.record import escape

# The parser behind re.compile (Python >= 3.11), where a pattern's literal text is read from: private, so used only
# for the prefilter, and any surprise from it means "no literal" (the pattern is then tried on every record).
_sre_parse: Any = importlib.import_module("re._parser")

KEY_PREFIX = "kmsg:"
NODE_DEVICE = "kernel"  # the device of a rule without a device group: the node's kernel
SXID_CONDITION = "nvswitch_sxid_error"  # an NVSwitch SXID (faults.py)
FALLEN_CONDITION = "gpu_fallen_off"  # a GPU off the bus that no NVML in this process owns (faults.py)
# The conditions the GPU lines raise: a kernel rule of the same name would mix its events with theirs.
RESERVED_CONDITIONS = frozenset({XID_CONDITION, LOST_CONDITION, RECOVERED_CONDITION, SXID_CONDITION, FALLEN_CONDITION})
MIN_LITERAL = 3  # a shorter literal filters too little to be worth a test

_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _rule(pattern: str, condition: str, severity: str = "warning", **more: Any) -> KernelRule:
    return msgspec.convert({"pattern": pattern, "condition": condition, "severity": severity, **more}, KernelRule)


DEFAULT_RULES: tuple[KernelRule, ...] = (
    # node-problem-detector kernel-monitor.json (OOMKilling, TaskHung, KernelOops, Ext4Error, IOError, ...)
    _rule(r"Killed process (?P<pid>\d+) \((?P<process>[^)]*)\) total-vm:\d+kB", "kernel_oom_kill"),
    _rule(r"task (?P<task>[\S ]+):(?P<pid>\w+) blocked for more than (?P<seconds>\w+) seconds\.", "kernel_task_hung"),
    _rule(r"BUG: unable to handle kernel", "kernel_oops", "critical"),
    _rule(r"BUG: unable to handle page fault", "kernel_oops", "critical"),
    _rule(r"divide error: 0000 \[#\d+\] SMP", "kernel_oops", "critical"),
    _rule(r"kernel BUG at (?P<location>\S+)", "kernel_oops", "critical"),
    _rule(r"unregister_netdevice: waiting for (?P<dev>\w+) to become free", "kernel_netdev_stuck", device="dev"),
    _rule(r"EXT4-fs error \(device (?P<dev>[^)]+)\)", "filesystem_error", "critical", device="dev"),
    _rule(r"XFS \((?P<dev>[^)]+)\):.* Shutting down filesystem", "filesystem_error", "critical", device="dev"),
    # readonly-monitor.json: a permanent condition there; here one that a reboot (or a week of quiet) clears
    _rule(
        r"Remounting filesystem read-only",
        "filesystem_read_only",
        "critical",
        mode="condition",
        clearAfterSeconds=604800,
    ),
    _rule(r"Buffer I/O error on dev(?:ice)? (?P<dev>[^,]+),", "block_io_error", device="dev"),
    _rule(r"CE memory read error on (?P<dimm>\S+)", "memory_read_error", device="dimm"),
    _rule(r"\[Hardware Error\]: event severity: corrected$", "hardware_error_cper", "info"),
    _rule(r"\[Hardware Error\]: event severity: recoverable$", "hardware_error_cper", "warning"),
    _rule(
        r"\[Hardware Error\]: event severity: fatal$",
        "hardware_error_cper_fatal",
        "critical",
        mode="condition",
        clearAfterSeconds=604800,
    ),
    # drivers/nvme/host/pci.c: "I/O 12 QID 4 timeout, aborting" (before 6.3) and "I/O tag 12 (000c) opcode 0x1
    # (I/O Cmd) QID 4 timeout, aborting ..." (since); three within 10 minutes are a sick drive, not a blip.
    _rule(
        r"nvme (?P<dev>nvme\d+): I/O (?:tag )?\d+ .*QID \d+ timeout",
        "nvme_timeout",
        device="dev",
        mode="condition",
        count=3,
        windowSeconds=600,
        clearAfterSeconds=1800,
    ),
    _rule(r"nvme (?P<dev>nvme\d+): controller is down; will reset", "nvme_reset", "critical", device="dev"),
    # arch/x86/kernel/cpu/mce/core.c: the summary line (rate-limited by the kernel) and the per-bank report
    _rule(r"mce: \[Hardware Error\]: Machine check events logged", "machine_check"),
    _rule(
        r"mce: \[Hardware Error\]: CPU (?P<cpu>\d+): Machine Check", "machine_check_exception", "critical", device="cpu"
    ),
)


@dataclass(frozen=True)
class CompiledKernelRule:
    rule: KernelRule
    key: str  # kmsg:<digest>: unchanged rules keep their state across reloads
    regex: re.Pattern[str]
    literal: bytes  # b"": no prefilter


def rule_key(rule: KernelRule) -> str:
    return KEY_PREFIX + hashlib.sha256(msgspec.json.encode(rule, order="sorted")).hexdigest()[:16]


def required_literal(pattern: str) -> str:
    """The longest run of literal characters the pattern requires at its top level ("" when none is known; a
    case-insensitive pattern has none)."""
    try:
        parsed = _sre_parse.parse(pattern)
    except Exception:
        return ""
    if parsed.state.flags & re.IGNORECASE:
        return ""
    best, run = "", []
    for op, arg in [*list(parsed), (None, None)]:
        if op is _sre_parse.LITERAL:
            run.append(chr(arg))
            continue
        text = "".join(run)
        best = text if len(text) > len(best) else best
        run = []
    return best if len(best) >= MIN_LITERAL else ""


def compile_rule(rule: KernelRule) -> CompiledKernelRule:
    literal = rule.contains or required_literal(rule.pattern)
    return CompiledKernelRule(rule, rule_key(rule), re.compile(rule.pattern), escape(literal))


def compile_rules(extra: Sequence[KernelRule], *, defaults: bool = True) -> list[CompiledKernelRule]:
    return [compile_rule(r) for r in (*(DEFAULT_RULES if defaults else ()), *extra)]


def rule_issues(raw_rules: Iterable[object], where: str = "kernelRules") -> list[ConfigIssue]:
    """What the types cannot say: the pattern compiles (with the position of the error), the device group is one
    of its named groups, the condition is a name and not one the GPU sources own."""
    issues: list[ConfigIssue] = []
    for i, raw in enumerate(raw_rules):
        if not isinstance(raw, dict):
            continue
        at = f"{where}[{i}]"
        pattern, condition, device = raw.get("pattern"), raw.get("condition"), raw.get("device", "")
        if isinstance(condition, str):
            if not _NAME.fullmatch(condition):
                issues.append(ConfigIssue(f"{at}.condition", "expected a name of letters, digits and _"))
            elif condition in RESERVED_CONDITIONS:
                issues.append(ConfigIssue(f"{at}.condition", "is the name of a GPU kernel-log condition; pick another"))
        if not isinstance(pattern, str):
            continue
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            pos = f" at position {exc.pos}" if exc.pos is not None else ""
            issues.append(ConfigIssue(f"{at}.pattern", f"not a valid regular expression{pos}: {exc.msg}"))
            continue
        if isinstance(device, str) and device and device not in compiled.groupindex:
            names = ", ".join(sorted(compiled.groupindex)) or "none"
            issues.append(ConfigIssue(f"{at}.device", f"not a named group of the pattern (its groups: {names})"))
    return issues
