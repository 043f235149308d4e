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
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

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


Labels = tuple[tuple[str, str], ...]


class LabelSets:
    """The label pairs of the samples ``Family.add`` makes, each set kept once from cycle to cycle.

    A tick builds every sample's label pairs afresh, and what its families hold alive is what the garbage
    collector's young collection walks once the tick's pause ends (``nvdaemon.gcpause``): on gpunode, 1,900 of the
    4,200 objects a core tick left to it were label tuples equal to the tick before's. ``canonical`` returns the
    equal tuple met before instead of the new one, which is then freed at once: the collector has seen the old one
    already (and stopped tracking it, as it holds only strings), and comparing a family with its previous render
    (``_Kept.same_samples``) meets the same objects.

    Two generations: the sets met since the last rotation and those met before it, so a set no cycle met for a
    whole cycle is forgotten (a container's veth that went). The node_exporter collectors rotate at each core
    cycle's first gather (``cycle``). A generation also ends at ``LIMIT`` sets, so a caller that never rotates (a
    test, a tool) stays bounded; what it holds beyond the live families' own tuples is one cycle's churn.
    Thread-safe as dict operations are: two threads racing at a rotation can at worst keep a set one generation
    longer.
    """

    LIMIT = SAMPLES_MAX

    __slots__ = ("_before", "_cycle", "_now")

    def __init__(self) -> None:
        self._now: dict[Labels, Labels] = {}
        self._before: dict[Labels, Labels] = {}
        self._cycle: weakref.ref[object] | None = None

    def __len__(self) -> int:
        """How many sets it keeps (one in both generations counted once)."""
        now = self._now
        return len(now) + sum(1 for key in self._before if key not in now)

    def canonical(self, pairs: Labels) -> Labels:
        got = self._now.get(pairs)
        if got is None:
            got = self._before.get(pairs, pairs)
            if len(self._now) >= self.LIMIT:
                self.rotate()
            self._now[got] = got
        return got

    def rotate(self) -> None:
        self._before, self._now = self._now, {}

    def cycle(self, reads: object | None) -> None:
        """Rotate when ``reads`` (the cycle's ``CycleReads``, held weakly) is another cycle's than the last seen;
        None (no cycle: a collector called on its own) changes nothing."""
        if reads is None:
            return
        seen = self._cycle() if self._cycle is not None else None
        if seen is not reads:
            self._cycle = weakref.ref(reads)
            self.rotate()


LABEL_SETS = LabelSets()


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
        # Most samples have one label (device, cpu, chip): nothing to sort (sorted() was a fifth of this method).
        pairs = tuple(sorted(items)) if len(items) > 1 else tuple(items)
        if len(self.samples) >= SAMPLES_MAX:
            raise ParseError(f"{self.name}: more than {SAMPLES_MAX} samples")
        for key, text in pairs:
            if len(text) > LABEL_MAX:
                raise ParseError(f"{self.name}: label {key} of {len(text)} characters, over {LABEL_MAX}")
        self.samples.append((LABEL_SETS.canonical(pairs), float(value)))
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
    """Families by name; same-named families from several collectors are joined (first HELP and type win).

    None of ``families`` is changed: one alone under its name is in the result as it is, those joined are copied
    first (copying every one, as before, made surface_families 0.12 ms instead of 0.06 on the gpunode fixture)."""
    out: dict[str, Family] = {}
    joined: set[str] = set()
    for fam in families:
        have = out.get(fam.name)
        if have is None:
            out[fam.name] = fam
            continue
        if fam.name not in joined:
            joined.add(fam.name)
            have = out[fam.name] = Family(have.name, have.help, have.type, list(have.samples), have.suffixed)
        have.samples.extend(fam.samples)
        have.suffixed = have.suffixed or fam.suffixed
    return out


def render(families: Mapping[str, Family]) -> bytes:
    """The text exposition (format 0.0.4) of ``families``; a family with no sample is left out, as Go does."""
    return SeriesRenderer().render(families)


Samples = list[tuple[Labels, float]]
# One series of the previous render: [rank in its family's sorted order, value, line, length of the line before the
# value]. A list, updated in place when only the value changed.
Entry = list[Any]


class _Kept:
    """What a family's previous render leaves for the next: what its text is made of but the samples (HELP, type,
    whether a SUFFIX label is looked for), its header, its series table, the samples it was rendered from, its
    text, and where those samples held a zero, with the zero's sign (0 and -0 are equal, and spelled apart)."""

    __slots__ = ("block", "head", "help", "samples", "series", "signs", "suffixed", "type", "zeros")

    def __init__(self, fam: Family, suffixed: bool, head: str, series: dict[Labels, Entry], block: str) -> None:
        self.help, self.type, self.suffixed, self.head, self.series = fam.help, fam.type, suffixed, head, series
        self.samples: Samples = fam.samples
        self.block = block
        self.zeros = [i for i, (_, value) in enumerate(fam.samples) if not value]
        self.signs = _signs(fam.samples, self.zeros)

    def same_head(self, fam: Family, suffixed: bool) -> bool:
        """Whether ``fam`` has this family's HELP, type and SUFFIX handling (its header and series texts hold)."""
        return (self.help, self.type, self.suffixed) == (fam.help, fam.type, suffixed)

    def same_samples(self, samples: Samples) -> bool:
        """Whether ``samples`` are those this family was rendered from: in the same order, zeros of the same sign.

        The comparison of the sample lists runs in C (tuples of strings and floats), a tenth of what looking every
        series up costs; a NaN never equals itself, so a family holding one is rendered again."""
        return samples == self.samples and (not self.zeros or _signs(samples, self.zeros) == self.signs)


def _signs(samples: Samples, where: list[int]) -> list[float]:
    """The sign (1.0 or -1.0) of the value of each sample at the indices ``where``."""
    return [math.copysign(1.0, samples[i][1]) for i in where]


class SeriesRenderer:
    """``render`` that keeps each family's text, and each series' text, from its previous call, for a page rendered
    again every tick.

    A family whose samples are those of the previous render (the same label pairs and values in the same order:
    a host's sizes, limits, addresses, info series and idle counters) is not rendered again: its text is reused
    after one comparison of the two sample lists (``_Kept.same_samples``). On this VM's own /proc and /sys, two
    node_* pages 15 s apart: 148 of 224 families and 275 of 425 samples were unchanged; on the gpunode fixture, whose
    files never change, all but the scrape durations and the clock. In the other families, what ``render`` rebuilds
    per sample (the ``name{labels} `` text, the value's spelling, the sort by label values) is looked up instead:
    per family, label pairs -> ``Entry`` (rank, the series' place in the family's sorted order; value; line).
    On the gpunode fixture's node_* page (327 families, 1,143 samples, 158 KB) that took a render from 1.6 ms to
    0.6 ms (medians over 10 successive snapshots x 20), and from 2.3 to 1.8 ms with every value changed (fractions
    spelled again). Memory stays bounded by the page: a family's table is the previous render's series only (one
    that went, such as a container's veth, is dropped by the next render), and a family not rendered is dropped
    with its table; the sample lists kept are the previous snapshot's.
    """

    def __init__(self) -> None:
        self._families: dict[str, _Kept] = {}

    def __len__(self) -> int:
        """How many series it keeps: those of the previous render."""
        return sum(len(kept.series) for kept in self._families.values())

    def render(self, families: Mapping[str, Family]) -> bytes:
        previous = self._families
        kept: dict[str, _Kept] = {}
        blocks: list[str] = []
        for name in sorted(families):
            fam = families[name]
            if not fam.samples:
                continue
            # What a series' text is made of, but its labels and value: the family's name, HELP, type, and
            # whether a SUFFIX label is looked for (Samples copied from another family, a textfile's joined across
            # files, may carry SUFFIX without the family's flag: a summary or histogram is always looked at.)
            suffixed = fam.suffixed or fam.type in ("summary", "histogram")
            cached = previous.get(name)
            if cached is not None and cached.same_head(fam, suffixed):
                if cached.same_samples(fam.samples):
                    kept[name] = cached
                    blocks.append(cached.block)
                    continue
                head, series = cached.head, cached.series
            else:
                head, series = f"# HELP {name} {escape_help(fam.help)}\n# TYPE {name} {fam.type}", {}
            lines = [head]
            table = _render_samples(name, fam, suffixed, series, lines)
            block = "\n".join(lines)
            kept[name] = _Kept(fam, suffixed, head, table, block)
            blocks.append(block)
        self._families = kept
        return ("\n".join(blocks) + "\n").encode() if blocks else b""


def _render_samples(
    name: str, fam: Family, suffixed: bool, series: dict[Labels, Entry], lines: list[str]
) -> dict[Labels, Entry]:
    """Append the sample lines of ``fam`` (sorted by label values, a duplicate series after its first dropped, as
    the Go registry refuses it) to ``lines``; returns the series table for the next render."""
    # The same series as last time (the common case): their entries, in input order, sorted by rank (ints, not
    # label tuples) when the input is not in order already. One labels' entry is one object: a duplicate is the
    # entry seen just before it once sorted (the sort is stable, so the first instance stays first).
    known: list[tuple[int, Entry, float]] = []
    last = -1
    in_order = True
    for labels, value in fam.samples:
        entry = series.get(labels)
        if entry is None:
            break
        rank = entry[0]
        if rank <= last:
            in_order = False
        last = rank
        known.append((rank, entry, value))
    else:
        if not in_order:
            known.sort(key=_labels_of)  # the rank
            seen: Entry | None = None
            unique = []
            for row in known:
                if row[1] is not seen:
                    unique.append(row)
                    seen = row[1]
            known = unique
        if len(known) == len(series):
            for _, entry, value in known:
                before = entry[1]
                # An equal value has the same text, but for 0 and -0 (equal, and spelled apart).
                if value != before or (not value and math.copysign(1.0, value) != math.copysign(1.0, before)):
                    entry[2] = entry[2][: entry[3]] + _value_text(value)
                    entry[1] = value
                lines.append(entry[2])
            return series
    # Series came or went: sort by label values and build the table again (reusing the texts known).
    table: dict[Labels, Entry] = {}
    previous: Labels | None = None
    for labels, value in sorted(fam.samples, key=_labels_of):
        if labels == previous:
            continue
        previous = labels
        entry = series.get(labels)  # new entries: the old table keeps its ranks whatever happens here
        if entry is None:
            prefix = _series_text(name, labels, suffixed)
            line, cut = prefix + _value_text(value), len(prefix)
        elif value != entry[1] or (not value and math.copysign(1.0, value) != math.copysign(1.0, entry[1])):
            line, cut = entry[2][: entry[3]] + _value_text(value), entry[3]
        else:
            line, cut = entry[2], entry[3]
        table[labels] = [len(table), value, line, cut]
        lines.append(line)
    return table


def _series_text(name: str, labels: Labels, suffixed: bool) -> str:
    """``name{k="v",...} `` of one series; a summary's or histogram's SUFFIX moved from its labels to its name."""
    shown = labels
    if suffixed:
        suffix = next((v for k, v in labels if k == SUFFIX), "")
        if suffix:
            name += suffix
            shown = tuple((k, v) for k, v in labels if k != SUFFIX)
    if not shown:
        return name + " "
    return name + "{" + ",".join([f'{k}="{escape_label_value(v)}"' for k, v in shown]) + "} "


def _value_text(value: float) -> str:
    # go_float's common case inline (a count below 1e6, not -0), as it is most of the samples
    if type(value) is float and value.is_integer() and -1e6 < value < 1e6 and (value or math.copysign(1.0, value) > 0):
        return str(int(value))
    return go_float(value)


_labels_of = operator.itemgetter(0)
