"""Kernel-log rules (nvdaemon/kmsg/rules.py): every built-in rule matches the kernel's own text for its fault, its
prefilter literal never hides that match, its device group names the device; the literal derived from a pattern;
and the config checks of ``kernelRules`` (a bad pattern, a device that is not a group, a condition name)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from nvdaemon.config import ConfigError, KernelRule
from nvdaemon.configload import parse_config
from nvdaemon.kmsg.record import parse_record, record_line
from nvdaemon.kmsg.rules import (
    DEFAULT_RULES,
    KEY_PREFIX,
    MIN_LITERAL,
    NODE_DEVICE,
    CompiledKernelRule,
    compile_rule,
    compile_rules,
    required_literal,
    rule_issues,
    rule_key,
)
from nvdaemon.kmsg.source import _device

# (message as the kernel prints it, the condition expected, the device expected)
KERNEL_LINES: list[tuple[str, str, str]] = [
    (
        "Out of memory: Killed process 12345 (python3) total-vm:12345678kB, anon-rss:1234567kB, file-rss:0kB, "
        "shmem-rss:0kB, UID:1000 pgtables:4321kB oom_score_adj:0",
        "kernel_oom_kill",
        NODE_DEVICE,
    ),
    (
        "Memory cgroup out of memory: Killed process 4242 (java) total-vm:8388608kB, anon-rss:4194304kB, file-rss:0kB",
        "kernel_oom_kill",
        NODE_DEVICE,
    ),
    ("INFO: task kworker/u16:2:1234 blocked for more than 120 seconds.", "kernel_task_hung", NODE_DEVICE),
    ("INFO: task jbd2/sda1-8:345 blocked for more than 122 seconds.", "kernel_task_hung", NODE_DEVICE),
    ("BUG: unable to handle kernel NULL pointer dereference at 0000000000000008", "kernel_oops", NODE_DEVICE),
    ("BUG: unable to handle kernel paging request at ffffffffc0a1b2c3", "kernel_oops", NODE_DEVICE),
    ("BUG: unable to handle page fault for address: ffffffffc0a1b2c3", "kernel_oops", NODE_DEVICE),
    ("divide error: 0000 [#1] SMP PTI", "kernel_oops", NODE_DEVICE),
    ("kernel BUG at mm/slub.c:4253!", "kernel_oops", NODE_DEVICE),
    ("unregister_netdevice: waiting for eth0 to become free. Usage count = 2", "kernel_netdev_stuck", "eth0"),
    ("unregister_netdevice: waiting for lo to become free. Usage count = 1", "kernel_netdev_stuck", "lo"),
    (
        "EXT4-fs error (device sda1): ext4_find_entry:1455: inode #2: comm ls: reading directory lblock 0",
        "filesystem_error",
        "sda1",
    ),
    ("XFS (dm-0): Corruption of in-memory data detected.  Shutting down filesystem", "filesystem_error", "dm-0"),
    ("XFS (sdb1): Log I/O Error Detected. Shutting down filesystem", "filesystem_error", "sdb1"),
    ("EXT4-fs (sda1): Remounting filesystem read-only", "filesystem_read_only", NODE_DEVICE),
    ("Buffer I/O error on dev sdb, logical block 0, async page read", "block_io_error", "sdb"),
    ("Buffer I/O error on device sdb1, logical block 12345", "block_io_error", "sdb1"),
    (
        "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 (channel:1 slot:0 page:0x1234 offset:0x0 "
        "grain:32 syndrome:0x0)",
        "memory_read_error",
        "CPU_SrcID#0_MC#0_Chan#1_DIMM#0",
    ),
    ("{1}[Hardware Error]: event severity: corrected", "hardware_error_cper", NODE_DEVICE),
    ("{2}[Hardware Error]: event severity: recoverable", "hardware_error_cper", NODE_DEVICE),
    ("{3}[Hardware Error]: event severity: fatal", "hardware_error_cper_fatal", NODE_DEVICE),
    # drivers/nvme/host/pci.c before 6.3, and since
    ("nvme nvme0: I/O 123 QID 4 timeout, aborting", "nvme_timeout", "nvme0"),
    ("nvme nvme2: I/O 5 QID 0 timeout, reset controller", "nvme_timeout", "nvme2"),
    ("nvme nvme0: I/O tag 70 (e046) opcode 0x2 (I/O Cmd) QID 6 timeout, aborting", "nvme_timeout", "nvme0"),
    (
        "nvme nvme1: I/O tag 0 (3000) opcode 0x1 (I/O Cmd) QID 1 timeout, aborting req_op:WRITE(1) size:131072",
        "nvme_timeout",
        "nvme1",
    ),
    ("nvme nvme0: I/O tag 24 (0018) QID 0 timeout, disable controller", "nvme_timeout", "nvme0"),
    ("nvme nvme0: controller is down; will reset: CSTS=0xffffffff, PCI_STATUS=0xffff", "nvme_reset", "nvme0"),
    ("nvme nvme3: controller is down; will reset: CSTS=0x3, PCI_STATUS read failed (134)", "nvme_reset", "nvme3"),
    ("mce: [Hardware Error]: Machine check events logged", "machine_check", NODE_DEVICE),
    ("mce: [Hardware Error]: CPU 2: Machine Check: 0 Bank 4: e600000000020408", "machine_check_exception", "2"),
    (
        "mce: [Hardware Error]: CPU 14: Machine Check Exception: 5 Bank 6: fe00000000800400",
        "machine_check_exception",
        "14",
    ),
]

# lines near the rules' text that are not faults
QUIET_LINES = [
    "NET: Registered protocol family 10",
    "EXT4-fs (sda1): mounted filesystem with ordered data mode. Opts: (null)",
    "XFS (sdb1): Mounting V5 Filesystem",
    "nvme nvme0: 64/0/0 default/read/poll queues",
    "{1}[Hardware Error]: It has been corrected by h/w and requires no further action",
    "mce: CPU0: Thermal monitoring enabled (TM1)",
]

COMPILED = compile_rules([])


def _matches(message: str) -> list[tuple[CompiledKernelRule, str]]:
    """The rules that match ``message`` as the source tries them: the literal tested on the record's escaped
    bytes first, the pattern on its text; with the device each names."""
    rec = parse_record(record_line(6, 1, 1, message))
    found = []
    for cr in COMPILED:
        m = cr.regex.search(rec.text)
        if m is not None:
            assert cr.literal in rec.message, f"the prefilter {cr.literal!r} hides a match of {cr.rule.pattern!r}"
            found.append((cr, _device(cr, m.groupdict())))
    return found


@pytest.mark.parametrize(("message", "condition", "device"), KERNEL_LINES)
def test_default_rule_matches_the_kernel_line(message: str, condition: str, device: str) -> None:
    assert [(cr.rule.condition, dev) for cr, dev in _matches(message)] == [(condition, device)]


def test_every_default_rule_has_a_line() -> None:
    matched = {cr.key for message, _, _ in KERNEL_LINES for cr, _ in _matches(message)}
    missing = [cr.rule.pattern for cr in COMPILED if cr.key not in matched]
    assert not missing
    assert len(COMPILED) == len(DEFAULT_RULES)


def test_every_default_rule_has_a_prefilter() -> None:
    # each built-in is tried only on records holding its literal: none is tried on every record
    assert all(len(cr.literal) >= MIN_LITERAL for cr in COMPILED)


@pytest.mark.parametrize("message", QUIET_LINES)
def test_near_misses_match_nothing(message: str) -> None:
    assert _matches(message) == []


def test_rule_keys_are_stable_and_distinct() -> None:
    keys = [rule_key(r) for r in DEFAULT_RULES]
    assert len(set(keys)) == len(keys)
    assert all(k.startswith(KEY_PREFIX) for k in keys)
    assert keys == [cr.key for cr in compile_rules([])]  # the same rule, the same key: state survives reloads
    changed = msgspec.structs.replace(DEFAULT_RULES[0], severity="critical")
    assert rule_key(changed) != keys[0]


def test_defaults_can_be_left_out() -> None:
    extra = KernelRule(pattern="hello world", condition="greeting")
    assert [cr.rule for cr in compile_rules([extra], defaults=False)] == [extra]
    assert [cr.rule for cr in compile_rules([extra])][-1] == extra


@pytest.mark.parametrize(
    ("pattern", "literal"),
    [
        ("Remounting filesystem read-only", "Remounting filesystem read-only"),
        (r"Killed process (?P<pid>\d+) \(", "Killed process "),
        (r"\[Hardware Error\]: event severity: fatal$", "[Hardware Error]: event severity: fatal"),
        (r"abc.defg", "defg"),  # the longest run
        (r"abcd+", "abc"),  # a repeated char is not required as written
        (r"abcd*x", "abc"),
        (r"(?i:abc)defg", "defg"),  # the scoped flag covers only its group
        ("a|bcdef", ""),  # alternation at the top level: no literal is required
        ("error|warning", ""),
        ("(?i)hello world", ""),  # case-insensitive: the bytes may differ
        ("ab", ""),  # shorter than MIN_LITERAL
        ("ab.cd", ""),
        (r"x(abcd)y", ""),  # inside a group only
        (r"\d+ \w+", ""),
        ("a(b", ""),  # not a pattern
        ("", ""),
    ],
)
def test_required_literal(pattern: str, literal: str) -> None:
    assert required_literal(pattern) == literal


def test_contains_overrides_the_derived_literal() -> None:
    cr = compile_rule(KernelRule(pattern=r"(foo|bar) failed", condition="x", contains="failed"))
    assert cr.literal == b"failed"
    assert compile_rule(KernelRule(pattern=r"(foo|bar) failed", condition="x")).literal == b" failed"


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("Temperatur \u00fcberschritten", "Temperatur \u00fcberschritten on sensor 3"),
        (r"path C:\\tmp\\x not found", "path C:\\tmp\\x not found"),
    ],
)
def test_prefilter_of_a_non_ascii_or_backslash_literal(pattern: str, message: str) -> None:
    cr = compile_rule(KernelRule(pattern=pattern, condition="x"))
    rec = parse_record(record_line(6, 1, 1, message))
    assert cr.regex.search(rec.text) is not None
    assert cr.literal in rec.message


# ---- config checks -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        ({"pattern": "a(b", "condition": "x"}, "kernelRules[0].pattern", "at position 1"),
        ({"pattern": "abc[", "condition": "x"}, "kernelRules[0].pattern", "at position 3"),
        ({"pattern": "(?P<dev>sd.)", "condition": "x", "device": "disk"}, "kernelRules[0].device", "its groups: dev"),
        ({"pattern": "sd.", "condition": "x", "device": "disk"}, "kernelRules[0].device", "its groups: none"),
        ({"pattern": "abc", "condition": "gpu_xid_error"}, "kernelRules[0].condition", "GPU kernel-log condition"),
        ({"pattern": "abc", "condition": "nvswitch_sxid_error"}, "kernelRules[0].condition", "pick another"),
        ({"pattern": "abc", "condition": "disk-failed"}, "kernelRules[0].condition", "letters, digits and _"),
        ({"pattern": "abc", "condition": "1st"}, "kernelRules[0].condition", "letters, digits and _"),
        ({"pattern": "abc", "condition": ""}, "kernelRules[0].condition", "letters, digits and _"),
    ],
)
def test_rule_issues(raw: dict[str, str], path: str, words: str) -> None:
    issues = rule_issues([raw])
    assert [i.path for i in issues] == [path]
    assert words in issues[0].message


def test_rule_issues_accepts_good_rules_and_counts_positions() -> None:
    good = {"pattern": "(?P<dev>nvme\\d+): oops", "condition": "nvme_oops", "device": "dev"}
    assert rule_issues([good, *DEFAULT_RULES_RAW]) == []
    issues = rule_issues([good, "not a mapping", {"pattern": "(", "condition": "x"}], where="k")
    assert [i.path for i in issues] == ["k[2].pattern"]


DEFAULT_RULES_RAW = [msgspec.to_builtins(r) for r in DEFAULT_RULES]


def test_config_rejects_a_bad_kernel_rule(tmp_path: Path) -> None:
    text = (
        f"node: n\nstateDir: {tmp_path / 'state'}\n"
        "kernelRules:\n"
        "  - pattern: 'ok (?P<dev>sd.)'\n"
        "    condition: disk_ok\n"
        "    device: dev\n"
        "  - pattern: 'EXT4-fs error (device'\n"
        "    condition: ext4\n"
        "  - {pattern: 'disk (?P<dev>sd.)', condition: disk_bad, device: disk}\n"
        "  - {pattern: 'fell off', condition: gpu_fallen_off}\n"
        "  - {pattern: 'x{2,1}', condition: 'not a name'}\n"
    )
    with pytest.raises(ConfigError) as err:
        parse_config(text, "t", env={})
    assert sorted(i.path for i in err.value.issues) == [
        "kernelRules[1].pattern",
        "kernelRules[2].device",
        "kernelRules[3].condition",
        "kernelRules[4].condition",
        "kernelRules[4].pattern",
    ]
    assert "kernelRules[1].pattern: not a valid regular expression at position 14" in str(err.value)
    assert "at position 2" in str(err.value)  # x{2,1}: min repeat greater than max repeat


def test_config_accepts_good_kernel_rules(tmp_path: Path) -> None:
    text = (
        f"node: n\nstateDir: {tmp_path / 'state'}\n"
        "kernelRules:\n"
        "  - pattern: 'ok (?P<dev>sd.)'\n"
        "    condition: disk_ok\n"
        "    device: dev\n"
        "    mode: condition\n"
        "    count: 2\n"
    )
    rules = parse_config(text, "t", env={}).config.kernel_rules
    assert [(r.condition, r.device, r.mode, r.count) for r in rules] == [("disk_ok", "dev", "condition", 2)]
