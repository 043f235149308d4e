"""The one table ``make bench`` prints: figure | ours | reference | ratio | target | met.

A row compares our figure with a reference measured in the same run (node_exporter, or a floor), or stands alone
(reference "-"). A target is either on the ratio (ours / reference) or on our own value; ``met`` is "yes" or "no"
when the row has a target it could be checked against, else "-". A reference that could not be measured (say
node_exporter is not installed) shows why in the reference column, and the ratio and ``met`` become "-".
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Target:
    """``on`` what (the ratio, or our value), compared how, with what."""

    on: Literal["ratio", "value"]
    op: str
    limit: float
    note: str = ""  # where the target comes from, when not the issue itself

    def text(self, unit: str) -> str:
        what = "ratio" if self.on == "ratio" else ""
        limit = fmt(self.limit, "" if self.on == "ratio" else unit)
        return " ".join(p for p in (what, self.op, limit) if p) + (f" ({self.note})" if self.note else "")


@dataclass
class Row:
    figure: str
    ours: float | str
    unit: str = ""
    reference: float | str = "-"
    target: Target | None = None

    @property
    def ratio(self) -> float | None:
        if isinstance(self.ours, str) or isinstance(self.reference, str) or not self.reference:
            return None
        if math.isnan(self.ours) or math.isnan(self.reference):
            return None
        return self.ours / self.reference

    @property
    def met(self) -> str:
        t = self.target
        if t is None or isinstance(self.ours, str) or math.isnan(self.ours):
            return "-"
        value = self.ratio if t.on == "ratio" else self.ours
        if value is None:
            return "-"
        return "yes" if _OPS[t.op](value, t.limit) else "no"

    def cells(self) -> list[str]:
        ratio = self.ratio
        return [
            self.figure,
            fmt(self.ours, self.unit),
            fmt(self.reference, self.unit),
            "-" if ratio is None else f"{ratio:.3g}",
            self.target.text(self.unit) if self.target else "-",
            self.met,
        ]

    def as_json(self) -> dict[str, Any]:
        def plain(v: float | str) -> float | str | None:
            return None if isinstance(v, float) and math.isnan(v) else v

        return {
            "figure": self.figure,
            "ours": plain(self.ours),
            "reference": plain(self.reference),
            "unit": self.unit,
            "ratio": self.ratio,
            "target": self.target.text(self.unit) if self.target else None,
            "met": self.met,
        }


def fmt(value: float | str, unit: str = "") -> str:
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "n/a"
    if value == int(value) and abs(value) >= 100:
        text = f"{int(value):,}"
    elif abs(value) >= 100:
        text = f"{value:,.0f}"
    else:
        text = f"{value:.3g}"
    return f"{text} {unit}".strip()


def failed(figure: str, why: str) -> Row:
    """A row for a benchmark that could not run: the first line of why, in the ours column."""
    first = why.strip().splitlines()[0] if why.strip() else "failed"
    return Row(figure, f"FAILED: {first}"[:70])


COLUMNS = ("figure", "ours", "reference", "ratio", "target", "met")


def render(rows: list[Row]) -> str:
    table = [list(COLUMNS), *(r.cells() for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [line(table[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(cells) for cells in table[1:]]
    return "\n".join(out)


def missed(rows: list[Row]) -> list[str]:
    """One line per row whose target was not met: by how much."""
    lines = []
    for r in rows:
        if r.met != "no" or r.target is None:
            continue
        value = r.ratio if r.target.on == "ratio" else r.ours
        assert value is not None and not isinstance(value, str)
        over = value / r.target.limit if r.target.limit else float("inf")
        lines.append(f"{r.figure}: {fmt(value)} against {r.target.text(r.unit)} ({over:.3g}x the limit)")
    return lines


def run_alone(run: Callable[[], tuple[list[Row], dict[str, Any]]]) -> None:
    """``python -m bench.<name>``: one benchmark's rows as a table, then its raw figures."""
    rows, raw = run()
    print(render(rows))
    width = max((len(k) for k in raw), default=0) + 2
    for key, value in raw.items():
        print(f"{key:<{width}} {value}")
