"""``docs/metrics.md`` lists every metric family the code declares under a fixed name, with that family's TYPE.

The declarations are found here without the generator, which lists only what its fixture agent exposes: an AST
walk of ``nvdaemon/`` for the exposition's family constructors (``CounterMetricFamily``, ``GaugeMetricFamily``,
``HistogramMetricFamily``) called with a literal name (a counter as exposed, with ``_total``), the collector
status families (``nvdaemon.server.metrics.STATUS_FAMILIES``), the hardware catalogue (``nodevitals_hw_*``) and the
dcgm-exporter and smartctl_exporter tables. So a family yielded only after something happens (a delivery, a drop, a
failed send) that the fixture agent no longer brings about fails here even though the page matches the generator.
A constructor called with a computed name fails too: its family could not be checked. node_exporter's families are
not walked: collectors name many after what the host has, and the node_exporter oracle tests check them.
"""

from __future__ import annotations

import ast
import re

import pytest

from docsgen import ROOT
from nvdaemon.catalogue import HELP
from nvdaemon.compat import dcgm, smartctl
from nvdaemon.server.metrics import PREFIX, STATUS_FAMILIES

PAGE = "docs/metrics.md"
CONSTRUCTORS = {"CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge", "HistogramMetricFamily": "histogram"}
ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<type>[a-z]+) \|", re.MULTILINE)


def _callee(call: ast.Call) -> str:
    fn = call.func
    return fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""


def constructed() -> tuple[dict[str, str], list[str]]:
    """The families built with the exposition's constructors in ``nvdaemon/``, name as exposed -> type, and where a
    constructor is called with a name that is not a literal (``file:line``)."""
    families: dict[str, str] = {}
    computed: list[str] = []
    for path in sorted((ROOT / "nvdaemon").rglob("*.py")):
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(rel))):
            if not isinstance(node, ast.Call) or (typ := CONSTRUCTORS.get(_callee(node))) is None:
                continue
            first = node.args[0] if node.args else None
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                computed.append(f"{rel}:{node.lineno}")
                continue
            name = first.value.removesuffix("_total") + "_total" if typ == "counter" else first.value
            families[name] = typ
    return families, computed


def declared() -> dict[str, str]:
    """Every family declared under a fixed name: name as exposed -> TYPE ("" where it depends on the tier)."""
    families, _ = constructed()
    families |= {name: typ for name, _, typ, _ in STATUS_FAMILIES}
    families |= {PREFIX + metric: "" for metric in HELP}
    families |= {name: typ for name, typ, *_ in dcgm.FAMILIES}
    families[dcgm.XID_FAMILY[0]] = dcgm.XID_FAMILY[1]
    families |= {name: typ for name, (typ, _) in smartctl.FAMILIES.items()}
    return families


def page_rows(text: str) -> dict[str, str]:
    """The page's families (first cell of a table row) -> the TYPE in its row."""
    return {m["name"]: m["type"] for m in ROW.finditer(text)}


def problems(text: str) -> list[str]:
    """What the page lacks of ``declared()``: a family with no row, or a row with another TYPE."""
    rows = page_rows(text)
    out = []
    for name, typ in sorted(declared().items()):
        if name not in rows:
            out.append(f"{name}: no row")
        elif typ and rows[name] != typ:
            out.append(f"{name}: TYPE {rows[name]} on the page, {typ} in the code")
    return out


def committed() -> str:
    return (ROOT / PAGE).read_text(encoding="utf-8")


def test_every_family_the_code_declares_is_on_the_page() -> None:
    found = problems(committed())
    assert not found, f"{PAGE} lacks families the code declares (make the fixture agent expose them):\n" + "\n".join(
        found
    )


def test_every_family_constructor_is_called_with_a_literal_name() -> None:
    families, computed = constructed()
    assert len(families) > 40  # the walk found the agent's own families
    assert not computed, f"family names this test cannot read: {computed}"


@pytest.mark.parametrize("source", ["constructor", "status", "catalogue", "dcgm", "smartctl"])
def test_a_family_missing_from_the_page_is_reported(source: str) -> None:
    families, _ = constructed()
    name = {
        "constructor": sorted(families)[0],
        "status": STATUS_FAMILIES[0][0],
        "catalogue": PREFIX + next(iter(HELP)),
        "dcgm": dcgm.XID_FAMILY[0],
        "smartctl": next(iter(smartctl.FAMILIES)),
    }[source]
    text = committed()
    row = re.compile(rf"^\| `{re.escape(name)}` \|.*\n", re.MULTILINE)
    assert row.search(text), f"{name} has no row to take out"
    assert problems(row.sub("", text)) == [f"{name}: no row"]
