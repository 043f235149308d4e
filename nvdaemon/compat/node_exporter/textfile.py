"""textfile: the families of the ``*.prom`` files in ``nodeExporter.textfileDirectory``, plus
``node_textfile_mtime_seconds{file}`` (mtime of each file read, whole seconds) and ``node_textfile_scrape_error``.

Files are read in name order and parsed with the Prometheus text format as node_exporter's parser (expfmt) reads
it: a file that does not parse, or that carries client-side timestamps, is skipped whole and sets
``node_textfile_scrape_error`` to 1, as does a directory that cannot be listed; the collector itself never fails.
A family without HELP gets node_exporter's generated help ("Metric read from <files>"); series missing a label
that other series of their family have get it with an empty value. A family repeated in several files is joined
when HELP and TYPE agree; otherwise the later file's copy is dropped (node_exporter's registry refuses it).
Collisions with families the agent exports are resolved by ``surface._merge_textfile``.

Each file is read up to ``nodeExporter.textfileMaxBytes``; a larger one, or one that is not a regular file (a FIFO
would block the read), is skipped like a file that does not parse, and is also listed as an error of the agent's
``node_exporter.textfile`` collector (node_exporter has no such cap, so its scrape_error alone would not say why).

Summaries and histograms keep their type: ``x{quantile}``, ``x_sum``, ``x_count``, and ``x_bucket{le}`` with the
``+Inf`` bucket Go's encoder adds when a file leaves it out.
"""

from __future__ import annotations

import glob
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from nvdaemon.collectors.base import FileTooLarge, NotRegularFile, ParseError, read_bounded
from nvdaemon.compat.node_exporter.context import NodeContext
from nvdaemon.compat.node_exporter.family import Family, FamilyType, gauge, go_float
from nvdaemon.compat.node_exporter.goparse import parse_float

MTIME_HELP = "Unixtime mtime of textfiles successfully read."
ERROR_HELP = "1 if there was an error opening or reading a file, 0 otherwise"
TYPES = ("counter", "gauge", "untyped", "summary", "histogram")
_METRIC_NAME = re.compile(rb"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(rb"[a-zA-Z_][a-zA-Z0-9_]*")
_BLANKS = b" \t"
_TIMESTAMP = re.compile(r"[+-]?[0-9]+", re.ASCII)


@dataclass
class Metric:
    labels: list[tuple[str, str]] = field(default_factory=list)
    value: float = 0.0
    timestamp: int | None = None
    count: float = 0.0  # summary/histogram
    sum: float = 0.0
    quantiles: dict[float, float] = field(default_factory=dict)
    buckets: dict[float, float] = field(default_factory=dict)


@dataclass
class TextFamily:
    name: str
    help: str | None = None
    type: str | None = None
    metrics: list[Metric] = field(default_factory=list)


def _float(token: str) -> float:
    if any(c in token for c in "pP_"):  # expfmt refuses these before asking strconv.ParseFloat
        raise ValueError("unsupported character in float")
    return parse_float(token)


class _Parser:
    """expfmt's TextParser, line by line: same accepted input, same families out."""

    def __init__(self) -> None:
        self.families: dict[str, TextFamily] = {}
        self.groups: dict[tuple[str, frozenset[tuple[str, str]]], Metric] = {}  # summaries/histograms by labels
        self.role = ""  # "count" or "sum" when the current name is a summary/histogram's _count/_sum

    def family(self, name: str) -> TextFamily:
        """The family a name belongs to: itself, or the summary/histogram it is the _sum/_count/_bucket of."""
        self.role = ""
        if name in self.families:
            return self.families[name]
        for suffix, kinds in (("_count", ("summary", "histogram")), ("_sum", ("summary", "histogram"))):
            base = self.families.get(name[: -len(suffix)]) if len(name) > len(suffix) else None
            if name.endswith(suffix) and base is not None and base.type in kinds:
                self.role = suffix[1:]
                return base
        if len(name) > 7 and name.endswith("_bucket"):
            base = self.families.get(name[:-7])
            if base is not None and base.type == "histogram":
                return base
        fam = self.families[name] = TextFamily(name)
        return fam

    def parse(self, data: bytes) -> dict[str, TextFamily]:
        lines = data.split(b"\n")
        if lines[-1].strip(_BLANKS):
            raise ParseError(f"text format parsing error in line {len(lines)}: unexpected end of input stream")
        for lineno, line in enumerate(lines[:-1], 1):
            try:
                self.line(line.lstrip(_BLANKS))
            except (ParseError, ValueError, UnicodeDecodeError) as exc:
                raise ParseError(f"text format parsing error in line {lineno}: {exc}") from None
        return {name: fam for name, fam in self.families.items() if fam.metrics}

    def line(self, line: bytes) -> None:
        if not line:
            return
        if line.startswith(b"#"):
            self.comment(line[1:].lstrip(_BLANKS))
        else:
            self.sample(line)

    def comment(self, rest: bytes) -> None:
        keyword, _, rest = _split_blank(rest)
        if keyword not in (b"HELP", b"TYPE") or not rest:
            return
        m = _METRIC_NAME.match(rest)
        name = m.group() if m else b""
        after = rest[len(name) :]
        if not after:
            return
        if after[0] not in _BLANKS:
            raise ParseError("invalid metric name in comment")
        fam = self.family(name.decode())
        text = after.lstrip(_BLANKS)
        if not text:
            return
        if keyword == b"HELP":
            if fam.help is not None:
                raise ParseError(f"second HELP line for metric name {fam.name!r}")
            fam.help = _unescape_help(text).decode("utf-8", "replace")
            return
        if fam.type is not None:
            raise ParseError(f"second TYPE line for metric name {fam.name!r}, or TYPE reported after samples")
        kind = text.replace(b"\\", b"").decode("utf-8", "replace")  # the parser drops backslashes here
        if kind.upper().lower() not in TYPES:  # Go upper-cases the word before looking it up
            raise ParseError(f"unknown metric type {kind!r}")
        fam.type = kind.upper().lower()

    def sample(self, line: bytes) -> None:
        m = _METRIC_NAME.match(line)
        if m is None:
            raise ParseError("invalid metric name")
        fam = self.family(m.group().decode())
        role = self.role
        if fam.type is None:
            fam.type = "untyped"
        rest = line[m.end() :].lstrip(_BLANKS)
        labels: list[tuple[str, str]] = []
        group: dict[str, str] = {}
        special = math.nan  # the quantile or le label's value
        if rest.startswith(b"{"):
            rest, special = self.labels(rest[1:].lstrip(_BLANKS), fam, labels, group)
        token, _, tail = _split_blank(rest)
        metric = Metric(labels)
        if fam.type in ("summary", "histogram"):  # one metric per label set, whichever line names it first
            key = (fam.name, frozenset(group.items()))
            existing = self.groups.get(key)
            if existing is None:
                self.groups[key] = metric
                fam.metrics.append(metric)
            else:
                metric = existing
        else:
            fam.metrics.append(metric)
        try:
            value = _float(token.decode())
        except ValueError:
            raise ParseError(f"expected float as value, got {token.decode('utf-8', 'replace')!r}") from None
        if fam.type in ("counter", "gauge", "untyped"):
            metric.value = value
        elif role == "count":
            metric.count = value
        elif role == "sum":
            metric.sum = value
        elif not math.isnan(special):
            (metric.quantiles if fam.type == "summary" else metric.buckets)[special] = value
        if tail or rest[len(token) :]:
            self.timestamp(tail, metric)

    def labels(
        self, rest: bytes, fam: TextFamily, labels: list[tuple[str, str]], group: dict[str, str]
    ) -> tuple[bytes, float]:
        special = math.nan
        while True:
            if rest.startswith(b"}"):
                return rest[1:].lstrip(_BLANKS), special
            m = _LABEL_NAME.match(rest)
            if m is None:
                raise ParseError(f"invalid label name for metric {fam.name!r}")
            name = m.group().decode()
            if name == "__name__":
                raise ParseError('label name "__name__" is reserved')
            is_special = (fam.type, name) in (("summary", "quantile"), ("histogram", "le"))
            if not is_special:
                labels.append((name, ""))
            rest = rest[m.end() :].lstrip(_BLANKS)
            if not rest.startswith(b"="):
                raise ParseError("expected '=' after label name")
            if len({n for n, _ in labels}) != len(labels):
                raise ParseError(f"duplicate label names for metric {fam.name!r}")
            rest = rest[1:].lstrip(_BLANKS)
            if not rest.startswith(b'"'):
                raise ParseError("expected '\"' at start of label value")
            raw, rest = _label_value(rest[1:])
            value = raw.decode("utf-8")  # invalid UTF-8 is a parse error there too
            if is_special:
                try:
                    special = _float(value)
                except ValueError:
                    raise ParseError(f"expected float as value for {name!r} label, got {value!r}") from None
            else:
                labels[-1] = (name, value)
                group[name] = value
            rest = rest.lstrip(_BLANKS)
            if rest.startswith(b","):
                rest = rest[1:].lstrip(_BLANKS)
            elif not rest.startswith(b"}"):
                raise ParseError(f"unexpected end of label value {value!r}")

    def timestamp(self, tail: bytes, metric: Metric) -> None:
        token, _, spurious = _split_blank(tail)
        if not _TIMESTAMP.fullmatch(token.decode("utf-8", "replace")) or not -(1 << 63) <= int(token) < 1 << 63:
            raise ParseError(f"expected integer as timestamp, got {token.decode('utf-8', 'replace')!r}")
        if spurious or tail[len(token) :]:
            raise ParseError("spurious string after timestamp")
        metric.timestamp = int(token)


def _split_blank(data: bytes) -> tuple[bytes, bytes, bytes]:
    """(token up to the first blank or tab, that blank, the rest after further blanks)."""
    for i, c in enumerate(data):
        if c in _BLANKS:
            return data[:i], data[i : i + 1], data[i + 1 :].lstrip(_BLANKS)
    return data, b"", b""


def _unescape_help(text: bytes) -> bytes:
    out = bytearray()
    i = 0
    while i < len(text):
        c = text[i]
        if c == 0x5C:  # backslash: only \\ and \n are valid in HELP (a trailing one escapes the newline: invalid)
            nxt = text[i + 1 : i + 2]
            if nxt not in (b"\\", b"n"):
                raise ParseError("invalid escape sequence " + repr(b"\\" + (nxt or b"\n")))
            out += b"\n" if nxt == b"n" else b"\\"
            i += 2
        else:
            out.append(c)
            i += 1
    return bytes(out)


def _label_value(data: bytes) -> tuple[bytes, bytes]:
    """A quoted label value's bytes (escapes \\\\, \\" and \\n decoded) and what follows its closing quote."""
    out = bytearray()
    i = 0
    while i < len(data):
        c = data[i]
        if c == 0x22:
            return bytes(out), data[i + 1 :]
        if c == 0x5C:
            nxt = data[i + 1 : i + 2]
            if nxt not in (b'"', b"\\", b"n"):
                raise ParseError("invalid escape sequence in label value")
            out += b"\n" if nxt == b"n" else nxt
            i += 2
            continue
        out.append(c)
        i += 1
    raise ParseError(f"label value {out.decode('utf-8', 'replace')!r} contains unescaped new-line")


def parse_text(data: bytes) -> dict[str, TextFamily]:
    """The families of one file; ParseError when expfmt would refuse it (or it carries timestamps)."""
    families = _Parser().parse(data)
    if any(m.timestamp is not None for fam in families.values() for m in fam.metrics):
        raise ParseError("contains unsupported client-side timestamps, skipping entire file")
    return families


def go_clean(path: str) -> str:
    """Go's ``filepath.Clean`` for the joined paths node_exporter labels files with."""
    cleaned = os.path.normpath(path) if path else "."
    return "/" + cleaned.lstrip("/") if cleaned.startswith("//") else cleaned


def _trunc_seconds(ns: int) -> float:
    """``float(mtime.UnixNano() / 1e9)`` in Go's integer division: whole seconds, truncated toward zero."""
    return float(ns // 1_000_000_000 if ns >= 0 else -((-ns) // 1_000_000_000))


def _read_file(path: str, limit: int) -> tuple[dict[str, TextFamily], float]:
    """A file's families and mtime. A directory named ``*.prom`` reads as an empty file: node_exporter's parser
    takes the read error it meets at the start of the first line for the end of the input."""
    try:
        data = read_bounded(Path(path), limit)
    except IsADirectoryError:
        return {}, _trunc_seconds(os.stat(path).st_mtime_ns)
    return parse_text(data), _trunc_seconds(os.stat(path).st_mtime_ns)


def read_directory(
    pattern: str, limit: int = 4 << 20, refused: list[str] | None = None
) -> tuple[list[tuple[str, dict[str, TextFamily], float]], bool]:
    """(path, families, mtime) per ``*.prom`` file read, and whether anything failed on the way; files over
    ``limit`` bytes or not regular files are also described in ``refused``."""
    errored = False
    dirs = sorted(glob.glob(pattern, include_hidden=True)) if pattern else []
    read: list[tuple[str, dict[str, TextFamily], float]] = []
    for directory in dirs or [pattern]:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            errored = errored or directory != ""  # no directory configured is no error
            continue
        for name in names:
            if not name.endswith(".prom"):
                continue
            path = go_clean(os.path.join(directory, name))
            try:
                families, mtime = _read_file(path, limit)
            except (FileTooLarge, NotRegularFile) as exc:
                errored = True
                if refused is not None:
                    refused.append(f"textfile {path}: {exc.strerror}")
                continue
            except (OSError, ParseError):
                errored = True
                continue
            read.append((path, families, mtime))
    return read, errored


def _with_all_labels(metrics: list[Metric]) -> list[tuple[Metric, dict[str, str]]]:
    """Each metric with every label name of its family (absent ones empty), as node_exporter fills them."""
    names = {n for m in metrics for n, _ in m.labels}
    return [(m, {n: "" for n in names} | dict(m.labels)) for m in metrics]


def _uint64(value: float) -> float:
    """Counts are stored as uint64 by node_exporter's parser (fractions dropped)."""
    return float(max(0, int(value))) if math.isfinite(value) else 0.0


def convert(fam: TextFamily, help: str) -> Family:
    """Our family for one parsed family (a summary or histogram with its _sum/_count/_bucket series)."""
    if fam.type in ("counter", "gauge", "untyped"):
        kind: FamilyType = fam.type  # type: ignore[assignment]
        out = Family(fam.name, help, kind)
        for m, labels in _with_all_labels(fam.metrics):
            out.add(m.value, labels)
        return out
    kind = "summary" if fam.type == "summary" else "histogram"
    out = Family(fam.name, help, kind)
    for m, labels in _with_all_labels(fam.metrics):
        count = _uint64(m.count)
        if kind == "summary":
            for q in sorted(m.quantiles):
                out.add(m.quantiles[q], labels, quantile=go_float(q))
        else:
            bounds = sorted(m.buckets)
            for b in bounds:
                out.add_suffixed("_bucket", _uint64(m.buckets[b]), {**labels, "le": go_float(b)})
            if not bounds or not math.isinf(bounds[-1]):  # Go's text encoder adds the +Inf bucket
                out.add_suffixed("_bucket", count, {**labels, "le": "+Inf"})
        out.add_suffixed("_sum", m.sum, labels)
        out.add_suffixed("_count", count, labels)
    return out


def collect(ctx: NodeContext, out: list[Family]) -> None:
    options = ctx.options
    read, errored = read_directory(options.textfile_directory, options.textfile_max_bytes, ctx.errors)
    files_of: dict[str, list[str]] = {}
    for path, families, _ in read:
        for name in families:
            files_of.setdefault(name, []).append(path)
    joined: dict[str, Family] = {}
    for _, families, _ in read:
        for fam in families.values():
            help = fam.help if fam.help is not None else "Metric read from " + ", ".join(files_of[fam.name])
            converted = convert(fam, help)
            have = joined.get(converted.name)
            if have is None:
                joined[converted.name] = converted
            elif (have.help, have.type) == (converted.help, converted.type):
                have.samples.extend(converted.samples)
            # else: node_exporter's registry refuses the later copy (inconsistent HELP or TYPE)
    out.extend(joined.values())
    if read:
        mtimes = Family("node_textfile_mtime_seconds", MTIME_HELP, "gauge")
        for path, _, mtime in read:
            mtimes.add(mtime, file=path)
        out.append(mtimes)
    out.append(gauge("node_textfile_scrape_error", ERROR_HELP, 1.0 if errored else 0.0))
