"""stat: kernel counters from ``<proc>/stat``, and the /proc/stat reading that the ``cpu`` collector shares.

Families: ``node_intr_total``, ``node_context_switches_total``, ``node_forks_total`` (counters, no unit),
``node_boot_time_seconds`` (Unix seconds), ``node_procs_running``, ``node_procs_blocked``. Per-vector softirq
counts are off by default in node_exporter 1.5 and not served, but the ``softirq`` line is still validated: a
malformed one fails both this collector and ``cpu``, as it does in node_exporter. CPU times are USER_HZ (100) ticks.

node_exporter parses the cpu/softirq lines (and the PSI files, see pressure.py) with Go's ``fmt.Sscanf``, whose
tolerance is not that of a plain split: a short cpu line is fine, a short softirq line is an error, trailing text
after the last value is ignored. ``sscanf`` below reproduces that subset so that we fail exactly when it fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nvdaemon.collectors.base import ParseError, read_parsed
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, counter, gauge
from nvdaemon.goparse import GO_SPACE, fields, parse_float, parse_int, parse_uint, scan_lines

USER_HZ = 100.0  # procfs divides /proc/stat ticks by a fixed 100, whatever CONFIG_HZ is
# A cpuN index at or above this is garbage: the kernel's NR_CPUS is at most 8,192. (Go would allocate the slice; a
# one-line "cpu65535" must not make 65,536 CPUs of samples here.)
MAX_CPUS = 8192
CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice")


def _go_float(token: str) -> float:
    """fmt's conversion of a scanned float token (strconv.ParseFloat, plus fmt's ``1.5p3`` binary exponent)."""
    if "p" in token and not token.lstrip("+-").lower().startswith("0x"):
        mantissa, _, exponent = token.partition("p")
        base = parse_float(mantissa)
        try:
            return math.ldexp(base, parse_int(exponent))
        except OverflowError:  # Go's math.Ldexp gives an infinity, not an error
            return math.copysign(math.inf, base)
    return parse_float(token)


class _Input:
    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def accept(self, chars: str) -> bool:
        if self.pos < len(self.text) and self.text[self.pos] in chars:
            self.pos += 1
            return True
        return False

    def skip_space(self) -> None:
        while self.accept(GO_SPACE):
            pass


def _float_token(inp: _Input) -> str:
    """The characters fmt's float scanner takes: it stops at the first one that cannot continue a number."""
    start = inp.pos
    if inp.accept("nN") and inp.accept("aA") and inp.accept("nN"):
        return inp.text[start : inp.pos]
    inp.accept("+-")
    if inp.accept("iI") and inp.accept("nN") and inp.accept("fF"):
        return inp.text[start : inp.pos]
    digits, exponent = "0123456789_", "eEpP"
    if inp.accept("0") and inp.accept("xX"):
        digits, exponent = "0123456789abcdefABCDEF_", "pP"
    while inp.accept(digits):
        pass
    if inp.accept("."):
        while inp.accept(digits):
            pass
    if inp.accept(exponent):
        inp.accept("+-")
        while inp.accept("0123456789_"):
            pass
    return inp.text[start : inp.pos]


def sscanf(text: str, fmt: str, *, partial: bool = False) -> list[str | float | int]:
    """Go's ``fmt.Sscanf`` for the verbs %s, %f and %d (uint64): the values scanned.

    Running out of input before a verb is Go's ``io.EOF``: with ``partial`` the values so far are returned (procfs
    accepts a short cpu line), else it is an error. Any other mismatch raises ``ValueError``. Input left after the
    last verb is ignored, as in Go.
    """
    inp, i = _Input(text), 0
    values: list[str | float | int] = []
    while i < len(fmt):
        c = fmt[i]
        if c in GO_SPACE:  # a format space wants one or more input spaces, or the end of input
            while i < len(fmt) and fmt[i] in GO_SPACE:
                i += 1
            if inp.pos < len(text) and text[inp.pos] not in GO_SPACE:
                raise ValueError("expected space in input to match format")
            inp.skip_space()
            continue
        if c == "%":
            verb, i = fmt[i + 1], i + 2
            inp.skip_space()
            if inp.pos >= len(text):
                if partial:
                    return values
                raise ValueError("unexpected EOF")
            if verb == "s":
                start = inp.pos
                while inp.pos < len(text) and text[inp.pos] not in GO_SPACE:
                    inp.pos += 1
                values.append(text[start : inp.pos])
            elif verb == "f":
                values.append(_go_float(_float_token(inp)))
            else:  # "d" into a uint64: decimal digits only
                start = inp.pos
                while inp.accept("0123456789"):
                    pass
                if inp.pos == start:
                    raise ValueError("expected integer")
                values.append(parse_uint(text[start : inp.pos]))
            continue
        if inp.pos >= len(text):
            raise ValueError("unexpected EOF")
        if text[inp.pos] != c:
            raise ValueError("input does not match format")
        inp.pos, i = inp.pos + 1, i + 1
    return values


@dataclass
class Stat:
    """What node_exporter takes from /proc/stat; absent lines stay 0, as in procfs."""

    cpus: list[tuple[float, ...]] = field(default_factory=list)  # by CPU index, seconds per CPU_FIELDS; gaps 0
    boot_time: int = 0
    intr: int = 0
    ctxt: int = 0
    forks: int = 0
    running: int = 0
    blocked: int = 0


_CPU_FORMAT = "%s" + " %f" * len(CPU_FIELDS)
_SOFTIRQ_FORMAT = "%s" + " %d" * 11  # total, then ten vectors
_UINT_KEYS = {
    "btime": "boot_time",
    "ctxt": "ctxt",
    "processes": "forks",
    "procs_running": "running",
    "procs_blocked": "blocked",
}


def _plain_numbers(line: str) -> list[str] | None:
    """The fields of a line of printable ASCII with single spaces whose fields after the first are decimal digits
    of at most 19 (below 2**64): what the kernel writes, and where ``sscanf``'s %f and %d agree with a split and
    int() (the float of such digits is exact enough: Go's ParseFloat rounds the same way)."""
    if not (line.isascii() and line.isprintable()):
        return None
    parts = line.split(" ")
    numbers = "".join(parts[1:])
    if not parts[0] or not numbers.isdigit() or max(map(len, parts[1:])) > 19 or not all(parts):
        return None
    return parts


def _cpu_line(stat: Stat, line: str) -> None:
    plain = _plain_numbers(line)
    if plain is not None:  # the same values sscanf gives, without scanning the line character by character
        values: list[str | float | int] = [plain[0], *map(float, plain[1 : len(CPU_FIELDS) + 1])]
    else:
        values = sscanf(line, _CPU_FORMAT, partial=True)  # fewer values is fine: older kernels print fewer
    name = str(values[0])
    times = tuple(float(v) / USER_HZ for v in values[1:]) + (0.0,) * (len(CPU_FIELDS) + 1 - len(values))
    index = -1 if name == "cpu" else parse_int(name[3:])
    if index == -1:  # the aggregate line ("cpu-1" lands here too, as in procfs); node_exporter does not use it
        return
    if not 0 <= index < MAX_CPUS:
        raise ValueError(f"CPU index {index} out of range")
    while len(stat.cpus) <= index:  # an offline CPU leaves a gap that reads as zeros
        stat.cpus.append((0.0,) * len(CPU_FIELDS))
    stat.cpus[index] = times


def parse_stat(text: str, path: str = "/proc/stat") -> Stat:
    """Parse /proc/stat as procfs 0.8 does: any malformed value of a known key fails the whole file."""
    stat = Stat()
    for line in scan_lines(text, path=path):
        parts = fields(line)
        if len(parts) < 2:  # procfs wants at least "<key> <value>"
            continue
        key = parts[0]
        try:
            if key in _UINT_KEYS:
                setattr(stat, _UINT_KEYS[key], parse_uint(parts[1]))
            elif key == "intr":
                stat.intr = parse_uint(parts[1])
                counts = parts[2:]  # the per-IRQ counts are not served, but must parse
                joined = "".join(counts)  # one check of them all: at most 19 digits always fit a uint64
                if counts and not (joined.isascii() and joined.isdigit() and max(map(len, counts)) <= 19):
                    for count in counts:
                        parse_uint(count)
            elif key == "softirq":
                plain = _plain_numbers(line)
                if plain is None or len(plain) < 12:
                    sscanf(line, _SOFTIRQ_FORMAT)  # ten vectors are required
            elif key.startswith("cpu"):
                _cpu_line(stat, line)
        except ValueError as exc:
            raise ParseError(f"{path}: couldn't parse {line[:80]!r} ({key}): {exc}") from None
    return stat


def read_stat(ctx: NodeContext) -> Stat:
    """/proc/stat, parsed once per cycle for the cpu and stat collectors (the read is shared with the hardware cpu
    collector too); the result is shared, so it is only read."""
    return read_parsed(ctx.proc("stat"), parse_stat)


def collect(ctx: NodeContext, out: list[Family]) -> None:
    stat = read_stat(ctx)
    out.append(counter("node_intr_total", "Total number of interrupts serviced.", float(stat.intr)))
    out.append(counter("node_context_switches_total", "Total number of context switches.", float(stat.ctxt)))
    out.append(counter("node_forks_total", "Total number of forks.", float(stat.forks)))
    out.append(gauge("node_boot_time_seconds", "Node boot time, in unixtime.", float(stat.boot_time)))
    out.append(gauge("node_procs_running", "Number of processes in runnable state.", float(stat.running)))
    blocked = float(stat.blocked)
    out.append(gauge("node_procs_blocked", "Number of processes blocked waiting for I/O to complete.", blocked))
