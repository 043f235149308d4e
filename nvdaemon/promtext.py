"""The Prometheus text exposition format (version 0.0.4), parsed as node_exporter's parser (Go expfmt's TextParser)
reads it: the same input accepted, the same families out, ``PromTextError`` (a ``ValueError``) where expfmt errs.

A parser of a wire format, not a collector: it reads the bytes it is given (no files) and imports only Go's parsing
rules (``nvdaemon/goparse.py``), so any layer may use it. The textfile collector
(``compat/node_exporter/textfile.py``) is its first user.

Values: expfmt refuses ``p``, ``P`` and ``_`` in a number before it calls Go's ``strconv.ParseFloat``, so what is
left of Go's float syntax is decimal (with an exponent), ``inf``/``infinity`` with a sign and an unsigned ``nan`` in
any case; a finite literal that overflows is an error, as in Go. Summaries and histograms keep their type:
``x{quantile}``, ``x_sum``, ``x_count`` and ``x_bucket{le}`` are folded into one metric per label set.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from nvdaemon.goparse import ParseError, parse_float

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


class PromTextError(ValueError):
    """Input expfmt's TextParser would refuse; the message says what and, once parsing ends, on which line."""


def _float(token: str) -> float:
    """expfmt's value parsing: ``strconv.ParseFloat`` once ``p``, ``P`` and ``_`` are refused (module docstring)."""
    if any(c in token for c in "pP_"):  # expfmt refuses these before asking strconv.ParseFloat
        raise ValueError("unsupported character in float")
    try:
        return parse_float(token)
    except ParseError as exc:
        raise PromTextError(str(exc)) from None


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
            raise PromTextError(f"text format parsing error in line {len(lines)}: unexpected end of input stream")
        for lineno, line in enumerate(lines[:-1], 1):
            try:
                self.line(line.lstrip(_BLANKS))
            except (PromTextError, ValueError, UnicodeDecodeError) as exc:
                raise PromTextError(f"text format parsing error in line {lineno}: {exc}") from None
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
            raise PromTextError("invalid metric name in comment")
        fam = self.family(name.decode())
        text = after.lstrip(_BLANKS)
        if not text:
            return
        if keyword == b"HELP":
            if fam.help is not None:
                raise PromTextError(f"second HELP line for metric name {fam.name!r}")
            fam.help = _unescape_help(text).decode("utf-8", "replace")
            return
        if fam.type is not None:
            raise PromTextError(f"second TYPE line for metric name {fam.name!r}, or TYPE reported after samples")
        kind = text.replace(b"\\", b"").decode("utf-8", "replace")  # the parser drops backslashes here
        if kind.upper().lower() not in TYPES:  # Go upper-cases the word before looking it up
            raise PromTextError(f"unknown metric type {kind!r}")
        fam.type = kind.upper().lower()

    def sample(self, line: bytes) -> None:
        m = _METRIC_NAME.match(line)
        if m is None:
            raise PromTextError("invalid metric name")
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
            raise PromTextError(f"expected float as value, got {token.decode('utf-8', 'replace')!r}") from None
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
                raise PromTextError(f"invalid label name for metric {fam.name!r}")
            name = m.group().decode()
            if name == "__name__":
                raise PromTextError('label name "__name__" is reserved')
            is_special = (fam.type, name) in (("summary", "quantile"), ("histogram", "le"))
            if not is_special:
                labels.append((name, ""))
            rest = rest[m.end() :].lstrip(_BLANKS)
            if not rest.startswith(b"="):
                raise PromTextError("expected '=' after label name")
            if len({n for n, _ in labels}) != len(labels):
                raise PromTextError(f"duplicate label names for metric {fam.name!r}")
            rest = rest[1:].lstrip(_BLANKS)
            if not rest.startswith(b'"'):
                raise PromTextError("expected '\"' at start of label value")
            raw, rest = _label_value(rest[1:])
            value = raw.decode("utf-8")  # invalid UTF-8 is a parse error there too
            if is_special:
                try:
                    special = _float(value)
                except ValueError:
                    raise PromTextError(f"expected float as value for {name!r} label, got {value!r}") from None
            else:
                labels[-1] = (name, value)
                group[name] = value
            rest = rest.lstrip(_BLANKS)
            if rest.startswith(b","):
                rest = rest[1:].lstrip(_BLANKS)
            elif not rest.startswith(b"}"):
                raise PromTextError(f"unexpected end of label value {value!r}")

    def timestamp(self, tail: bytes, metric: Metric) -> None:
        token, _, spurious = _split_blank(tail)
        if not _TIMESTAMP.fullmatch(token.decode("utf-8", "replace")) or not -(1 << 63) <= int(token) < 1 << 63:
            raise PromTextError(f"expected integer as timestamp, got {token.decode('utf-8', 'replace')!r}")
        if spurious or tail[len(token) :]:
            raise PromTextError("spurious string after timestamp")
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
                raise PromTextError("invalid escape sequence " + repr(b"\\" + (nxt or b"\n")))
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
                raise PromTextError("invalid escape sequence in label value")
            out += b"\n" if nxt == b"n" else nxt
            i += 2
            continue
        out.append(c)
        i += 1
    raise PromTextError(f"label value {out.decode('utf-8', 'replace')!r} contains unescaped new-line")


def parse_text(data: bytes) -> dict[str, TextFamily]:
    """The families of one file; PromTextError when expfmt would refuse it (or it carries timestamps)."""
    families = _Parser().parse(data)
    if any(m.timestamp is not None for fam in families.values() for m in fam.metrics):
        raise PromTextError("contains unsupported client-side timestamps, skipping entire file")
    return families
