"""How much a parser may make of a host file: the shape of its text and what a parse of it may yield.

``base.read_bounded`` caps the bytes of a host file; these bounds cap what those bytes become once parsed, because a
file within its byte cap can still be pathological: a 4 MB /proc/stat line of "12 12 12 ..." split on whitespace
made 1.3 million strings, about 100 MiB, from a 4 MB read. Every figure is a hard ceiling far above what a real
host writes, so only a broken or hostile file (a bind mount in a pod, a sick driver) ever meets one.

- *Shape* (bytes per line, lines per file), checked by ``check_lines`` on the bytes before any parser splits them:
  a /proc or root file system text file has at most ``LINES_MAX`` lines of at most ``LINE_MAX`` bytes, a /proc
  table that grows with the host (mounts, network tables, diskstats) ``TABLE_LINES_MAX`` lines of
  ``TABLE_LINE_MAX`` bytes, and /proc/stat and /proc/schedstat, which grow with the CPUs and IRQs, have their own
  figures (``line_limits``). A file out of shape is a ``ParseError`` (``LineTooLong``, ``TooManyLines``) of every
  collector reading it, not an absent source.
- *Yield*, kept by the parsers themselves: a line splits into at most ``FIELDS_MAX`` fields (``split_fields``), a
  file yields at most ``ENTRIES_MAX`` entries (``too_many`` names the problem), a label value taken from a host
  file is at most ``LABEL_MAX`` characters (``label_value``), and per-line problems are kept word for word only up
  to ``ERRORS_MAX`` per file, the rest counted (``Problems``).

Plain functions and values, no I/O: the reading side (``base``) applies the shape check to what it reads.
"""

from __future__ import annotations

import os

from nvdaemon.goparse import ParseError

# The shape of a text file, checked before it is parsed. Real lines are short: /proc/meminfo's, /proc/loadavg's and
# PSI lines are under 100 bytes, a /proc/mdstat array line of 64 members about 1 KB, a udev database line a few
# hundred bytes, a mountinfo line two paths of at most 4 KiB (PATH_MAX; 4x that octal-escaped) and an overlay mount's
# options. The cap is twice node_exporter's own line limit (bufio.Scanner's 64 KiB), not a few KiB: the drop-in
# surface must still see a line just past 64 KiB to give node_exporter's verdict on it (some of its parsers stop
# there silently). Split line by line, such a line makes at most ~44,000 strings, about 2 MB, for a moment.
LINE_MAX = 128 * 1024  # bytes, newline not counted
LINES_MAX = 4096  # /proc/meminfo has about 60 lines, /proc/vmstat about 200, a udev database entry about 40
TABLE_LINE_MAX = LINE_MAX  # /proc/net/* and mount tables
TABLE_LINES_MAX = 65_536  # twice the 30,000 mounts base.PROC_TABLE_MAX is sized for; interfaces and disks are fewer
# /proc/stat's ``intr`` line has one count per IRQ number: over 64 KiB on 128-CPU hosts with many MSI-X vectors, the
# reason procfs reads it with a 1 MiB line buffer; one cpuN line per CPU (8,192 at most, the kernel's NR_CPUS limit).
STAT_LINE_MAX = 1024 * 1024
STAT_LINES_MAX = 16_384
# /proc/schedstat: one cpuN line per CPU and one domainN line per scheduling domain level of each CPU (2 to 5).
SCHEDSTAT_LINES_MAX = 65_536
_OWN_LIMITS = {"stat": (STAT_LINE_MAX, STAT_LINES_MAX), "schedstat": (LINE_MAX, SCHEDSTAT_LINES_MAX)}
# A file of at most LINES_MAX bytes is in shape whatever its kind (the reader's short cut relies on it).
assert min(LINE_MAX, STAT_LINES_MAX, SCHEDSTAT_LINES_MAX, TABLE_LINES_MAX) >= LINES_MAX
FIELDS_MAX = 64  # a /proc/stat cpu line has 11 fields, a diskstats line 20, a /proc/net/dev line 17
ENTRIES_MAX = 8192  # CPUs (NR_CPUS is at most 8,192), interfaces, disks or keys one file may yield
LABEL_MAX = 4096  # characters of a label value from a host file: a mount point is at most PATH_MAX (4,096) bytes
ERRORS_MAX = 16  # per-line problems kept word for word per file; the rest are counted

_Path = str | os.PathLike[str]  # a host file as the reader names it (base.HostPath: a str or a Path)


class LineTooLong(ParseError):
    """A line of a host text file over the line cap of its kind; the file was not parsed."""

    def __init__(self, path: _Path, number: int, limit: int) -> None:
        super().__init__(f"{path}: line {number} longer than {limit} bytes, not parsed")


class TooManyLines(ParseError):
    """A host text file with more lines than the cap of its kind; the file was not parsed."""

    def __init__(self, path: _Path, limit: int) -> None:
        super().__init__(f"{path}: more than {limit} lines, not parsed")


def line_limits(path: _Path, table: bool) -> tuple[int, int]:
    """``(longest line in bytes, most lines)`` of a text file: a growing /proc table's when ``table``, else the
    file's own (/proc/stat, /proc/schedstat, told by its name) or the default of a /proc or root file system file."""
    if table:
        return TABLE_LINE_MAX, TABLE_LINES_MAX
    return _OWN_LIMITS.get(os.path.basename(path), (LINE_MAX, LINES_MAX))


def check_lines(data: bytes, path: _Path, line_max: int, lines_max: int) -> None:
    """Raise ``TooManyLines`` or ``LineTooLong`` unless ``data`` has at most ``lines_max`` lines, each of at most
    ``line_max`` bytes (the newline not counted). No copy is made: one count of newlines, then a jump from each line
    start to the last newline within ``line_max`` bytes of it, so a file of short lines costs a few C-level scans."""
    if data.count(b"\n") + (not data.endswith(b"\n")) > lines_max:
        raise TooManyLines(path, lines_max)
    pos, end = 0, len(data)
    while end - pos > line_max:
        # The line starting at pos fits iff its newline is among the next line_max + 1 bytes.
        newline = data.rfind(b"\n", pos, pos + line_max + 1)
        if newline < 0:
            raise LineTooLong(path, data.count(b"\n", 0, pos) + 1, line_max)
        pos = newline + 1


def split_fields(line: str, what: str, limit: int = FIELDS_MAX) -> list[str]:
    """``line.split()``, refusing a line of more than ``limit`` fields (``ParseError`` naming ``what``) without
    splitting the rest of it."""
    parts = line.split(None, limit)
    if len(parts) > limit:
        raise ParseError(f"{what}: more than {limit} fields in {line[:60]!r}")
    return parts


def label_value(text: str, what: str) -> str:
    """``text`` as a label value: ``ParseError`` naming ``what`` when longer than ``LABEL_MAX`` characters."""
    if len(text) > LABEL_MAX:
        raise ParseError(f"{what}: label value of {len(text)} characters, over {LABEL_MAX}: {text[:40]!r}")
    return text


class Problems(list[str]):
    """A parser's per-line problems: the first ``ERRORS_MAX`` word for word, the rest only counted, so a file of
    thousands of bad lines keeps (and logs) a few lines, not thousands."""

    def __init__(self) -> None:
        super().__init__()
        self.more = 0

    def append(self, problem: str) -> None:
        if len(self) < ERRORS_MAX:
            super().append(problem)
        else:
            self.more += 1

    def summary(self) -> list[str]:
        """The problems kept, then one line counting those that were not."""
        return [*self, f"and {self.more} more"] if self.more else list(self)


def too_many(where: str) -> str:
    """The problem recorded when a file yields more than ``ENTRIES_MAX`` entries (the rest are not read)."""
    return f"{where}: more than {ENTRIES_MAX} entries, the rest not read"
