"""A strict parser of the Prometheus text format (0.0.4), for comparing two expositions family by family."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


@dataclass
class ParsedFamily:
    name: str
    type: str = "untyped"
    help: str | None = None
    samples: dict[Labels, float] = field(default_factory=dict)


def _unescape(text: str, quotes: bool) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append({"n": "\n", "\\": "\\", '"': '"' if quotes else '\\"'}.get(nxt, "\\" + nxt))
            i += 2
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def parse_labels(body: str) -> Labels:
    labels: list[tuple[str, str]] = []
    pos = 0
    while pos < len(body):
        m = _LABEL.match(body, pos)
        if m is None:
            raise ValueError(f"bad label set {body!r}")
        labels.append((m.group(1), _unescape(m.group(2), quotes=True)))
        pos = m.end()
    return tuple(sorted(labels))


def parse_value(token: str) -> float:
    if token in ("+Inf", "Inf"):
        return math.inf
    if token == "-Inf":
        return -math.inf
    return float(token)


def parse(text: str) -> dict[str, ParsedFamily]:
    """Families by name; a sample whose name has no HELP/TYPE of its own is a family of its own (untyped)."""
    families: dict[str, ParsedFamily] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                fam = families.setdefault(parts[2], ParsedFamily(parts[2]))
                rest = parts[3] if len(parts) > 3 else ""
                if parts[1] == "HELP":
                    fam.help = _unescape(rest, quotes=False)
                else:
                    fam.type = rest.strip()
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"line {lineno}: not a sample: {line!r}")
        name = m.group(1)
        labels = parse_labels(m.group(3) or "")
        base = _composite_base(families, name)
        if base is not None:  # a summary's or histogram's _sum/_count/_bucket series, kept under its family
            labels = tuple(sorted((*labels, ("__name__", name))))
            name = base
        fam = families.setdefault(name, ParsedFamily(name))
        if labels in fam.samples:
            raise ValueError(f"line {lineno}: duplicate series {name}{dict(labels)}")
        fam.samples[labels] = parse_value(m.group(4))
    return families


def _composite_base(families: dict[str, ParsedFamily], name: str) -> str | None:
    for suffix in ("_sum", "_count", "_bucket"):
        base = name.removesuffix(suffix)
        kind = families[base].type if base != name and base in families else ""
        if kind == "histogram" or (kind == "summary" and suffix != "_bucket"):
            return base
    return None


def same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))
