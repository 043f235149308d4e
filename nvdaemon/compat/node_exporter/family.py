"""Metric families of the node_exporter surface, and their text exposition in node_exporter's own format.

The surface is rendered as text by us rather than through prometheus_client: node_exporter's families include
counters and untyped families whose names prometheus_client would rewrite (it appends ``_total`` and drops
``untyped`` suffix rules), and dashboards depend on the exact names. The format follows the Go client's text
encoder: families sorted by name, label names sorted, samples sorted by label values, floats in Go's shortest
``'g'`` form (``1.6647749632e+10``), HELP escaping of backslash and newline.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from nvdaemon.collectors.bounds import LABEL_MAX
from nvdaemon.exposition import escape_help, escape_label_value
from nvdaemon.goparse import ParseError

FamilyType = Literal["gauge", "counter", "untyped", "summary", "histogram"]
# The most samples one family holds: node_cpu_seconds_total of the largest host, 8 modes x 8,192 CPUs (NR_CPUS).
# Past it, or past LABEL_MAX in a label value, a family is a ParseError of the collector building it: what a host
# file yields is bounded whatever its lines hold, and so is its rendering on /metrics.
SAMPLES_MAX = 65_536
# A summary's or histogram's _sum/_count/_bucket series carry their suffix in this pseudo label (a label name
# starting with "__" is reserved in Prometheus, so no real label can collide with it); rendering moves it back.
SUFFIX = "__suffix__"


@dataclass
class Family:
    """One metric family: name, HELP text, type and its samples (label pairs -> value)."""

    name: str
    help: str
    type: FamilyType = "gauge"
    samples: list[tuple[tuple[tuple[str, str], ...], float]] = field(default_factory=list)
    suffixed: bool = False  # some sample carries SUFFIX (only then does rendering look for it)

    def add(self, value: float, labels: Mapping[str, str] | None = None, **kw: str) -> Family:
        """One more sample; ``ParseError`` past ``SAMPLES_MAX`` samples or with a label value over ``LABEL_MAX``."""
        items = ({**labels, **kw} if kw else labels).items() if labels else kw.items()
        pairs = tuple(sorted(items))
        if len(self.samples) >= SAMPLES_MAX:
            raise ParseError(f"{self.name}: more than {SAMPLES_MAX} samples")
        for key, text in pairs:
            if len(text) > LABEL_MAX:
                raise ParseError(f"{self.name}: label {key} of {len(text)} characters, over {LABEL_MAX}")
        self.samples.append((pairs, float(value)))
        return self

    def add_suffixed(self, suffix: str, value: float, labels: Mapping[str, str]) -> Family:
        """A summary's or histogram's ``<name>_sum``, ``_count`` or ``_bucket`` series."""
        self.suffixed = True
        return self.add(value, labels, **{SUFFIX: suffix})


def _single(kind: FamilyType, name: str, help: str, value: float | None, labels: dict[str, str]) -> Family:
    fam = Family(name, help, kind)
    if value is not None:
        fam.add(value, labels)
    return fam


def gauge(name: str, help: str, value: float | None = None, **labels: str) -> Family:
    return _single("gauge", name, help, value, labels)


def counter(name: str, help: str, value: float | None = None, **labels: str) -> Family:
    return _single("counter", name, help, value, labels)


def untyped(name: str, help: str, value: float | None = None, **labels: str) -> Family:
    return _single("untyped", name, help, value, labels)


def go_float(value: float) -> str:
    """``strconv.FormatFloat(v, 'g', -1, 64)``: shortest digits, exponent form below 1e-4 or from 1e6 up."""
    value = float(value)  # callers pass ints too (smartctl's counts), and int has no is_integer() before 3.12
    if value.is_integer():  # the common case: a count (NaN and the infinities are not integers)
        if -1e6 < value < 1e6:
            return str(int(value)) if value or math.copysign(1.0, value) > 0 else "-0"
        if -_EXACT < value < _EXACT:
            # Every integer below 2**53 is a float, so its exact digits are the shortest that round-trip (Go's).
            text = str(int(value))
            prefix, text = ("-", text[1:]) if text[0] == "-" else ("", text)
            digits = text.rstrip("0")
            exp = len(text) - 1  # at least 6 here: exponent form
            lead = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
            return f"{prefix}{lead}e+{exp:02d}"
    if math.isnan(value):
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    if -1e6 < value < 1e6 and value.is_integer():  # the common case: a small count, written as is
        return str(int(value))
    # repr gives the shortest digits that round-trip, as Go's shortest mode does; only the layout differs.
    text = repr(value)
    prefix = ""
    if text[0] == "-":
        prefix, text = "-", text[1:]
    mantissa, _, exp_text = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + (int(exp_text) if exp_text else 0) - (len(whole + frac) - len(digits))
    digits = digits.rstrip("0")
    exp = point - 1  # decimal exponent of the leading digit
    if exp < -4 or exp >= 6:
        lead = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{lead}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point >= len(digits):
        return prefix + digits + "0" * (point - len(digits))
    if point > 0:
        return prefix + digits[:point] + "." + digits[point:]
    return prefix + "0." + "0" * (-point) + digits


_EXACT = float(2**53)


def label_text(pairs: Iterable[tuple[str, str]]) -> str:
    """``k1="v1",k2="v2"`` in the order given (the dcgm surface keeps dcgm-exporter's order, unsorted)."""
    return ",".join(f'{k}="{escape_label_value(v)}"' for k, v in pairs)


def merge(families: Iterable[Family]) -> dict[str, Family]:
    """Families by name; same-named families from several collectors are joined (first HELP and type win)."""
    out: dict[str, Family] = {}
    for fam in families:
        have = out.get(fam.name)
        if have is None:
            out[fam.name] = Family(fam.name, fam.help, fam.type, list(fam.samples), fam.suffixed)
        else:
            have.samples.extend(fam.samples)
            have.suffixed = have.suffixed or fam.suffixed
    return out


def render(families: Mapping[str, Family]) -> bytes:
    """The text exposition (format 0.0.4) of ``families``; a family with no sample is left out, as Go does."""
    lines: list[str] = []
    append = lines.append
    fmt = go_float
    esc = escape_label_value
    for name in sorted(families):
        fam = families[name]
        if not fam.samples:
            continue
        append(f"# HELP {name} {escape_help(fam.help)}")
        append(f"# TYPE {name} {fam.type}")
        previous: tuple[tuple[str, str], ...] | None = None
        # Samples copied from another family (a textfile's, joined across files) may carry SUFFIX without this
        # family's flag: a summary or histogram is always looked at.
        suffixed = fam.suffixed or fam.type in ("summary", "histogram")
        # A stable sort puts a duplicate series right after its first instance, which is the one kept: the Go
        # registry refuses a duplicate series, and so do we.
        for labels, value in sorted(fam.samples, key=_labels_of):
            if labels == previous:
                continue
            previous = labels
            sample_name, shown = name, labels
            if suffixed:
                suffix = next((v for k, v in labels if k == SUFFIX), "")
                if suffix:
                    sample_name = name + suffix
                    shown = tuple((k, v) for k, v in labels if k != SUFFIX)
            # go_float's common case inline (a count below 1e6, not -0), as it is most of the samples
            text = (
                str(int(value))
                if type(value) is float
                and value.is_integer()
                and -1e6 < value < 1e6
                and (value or math.copysign(1.0, value) > 0)
                else fmt(value)
            )
            if shown:
                body = ",".join([f'{k}="{esc(v)}"' for k, v in shown])
                append(f"{sample_name}{{{body}}} {text}")
            else:
                append(f"{sample_name} {text}")
    return ("\n".join(lines) + "\n").encode() if lines else b""


_labels_of = operator.itemgetter(0)
