"""Validate a parsed YAML tree against msgspec struct types and collect *every* problem, not just the first.

msgspec stops at the first error; operators fixing a config on a node want the whole list, each with the key path,
the line in the file and what was expected. This walks the tree against ``msgspec.inspect`` type info. Values are
never echoed (they may be secrets), only key names and the allowed choices.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any

import msgspec.inspect as mi
import yaml


@dataclass
class ConfigIssue:
    path: str
    message: str
    line: int | None = None

    def where(self) -> str:
        return f":{self.line}" if self.line is not None else ""


def yaml_index(text: str) -> tuple[dict[str, int], list[ConfigIssue]]:
    """Walk the YAML node tree once: the 1-based line of each key path (``rules[0].op``), and the keys given twice
    in one mapping (YAML loaders silently keep the last, which could drop a whole rules list)."""
    lines: dict[str, int] = {}
    duplicates: list[ConfigIssue] = []

    def walk(node: yaml.Node, path: str) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key, value in node.value:
                name = str(key.value)
                sub = f"{path}.{name}" if path else name
                line = key.start_mark.line + 1
                if name in seen:
                    duplicates.append(ConfigIssue(sub, "key given twice in the same mapping", line))
                seen.add(name)
                walk(value, sub)
                lines[sub] = line
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is not None:
        walk(root, "")
    return lines, duplicates


def _describe(t: mi.Type) -> str:
    if isinstance(t, mi.StructType):
        return "a mapping"
    if isinstance(t, mi.ListType):
        return f"a list of {_describe(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"a mapping of names to {_describe(t.value_type)}"
    if isinstance(t, mi.StrType):
        return "a string"
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.IntType):
        return "an integer" + _bounds(t)
    if isinstance(t, mi.FloatType):
        return "a number" + _bounds(t)
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(repr(v) for v in t.values)
    if isinstance(t, mi.UnionType):
        return " or ".join(_describe(x) for x in t.types if not isinstance(x, mi.NoneType))
    return "a value"


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    parts = []
    if t.ge is not None:
        parts.append(f">= {t.ge}")
    if t.gt is not None:
        parts.append(f"> {t.gt}")
    if t.le is not None:
        parts.append(f"<= {t.le}")
    if t.lt is not None:
        parts.append(f"< {t.lt}")
    return f" {' and '.join(parts)}" if parts else ""


def _in_bounds(value: float, t: mi.IntType | mi.FloatType) -> bool:
    return not (
        (t.ge is not None and value < t.ge)
        or (t.gt is not None and value <= t.gt)
        or (t.le is not None and value > t.le)
        or (t.lt is not None and value >= t.lt)
    )


def _matches(t: mi.Type, value: Any) -> bool:
    """Shallow check used to pick a union member."""
    if isinstance(t, mi.NoneType):
        return value is None
    if isinstance(t, mi.StrType):
        return isinstance(value, str)
    if isinstance(t, mi.BoolType):
        return isinstance(value, bool)
    if isinstance(t, mi.IntType):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(t, mi.FloatType):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(t, mi.LiteralType):
        return value in t.values
    if isinstance(t, mi.StructType | mi.DictType):
        return isinstance(value, dict)
    if isinstance(t, mi.ListType):
        return isinstance(value, list)
    return True


def _check(t: mi.Type, value: Any, path: str, out: list[ConfigIssue], redact: frozenset[str] | set[str]) -> None:
    if isinstance(t, mi.UnionType):
        for member in t.types:
            if _matches(member, value):
                _check(member, value, path, out, redact)
                return
        out.append(ConfigIssue(path, f"expected {_describe(t)}"))
        return
    if (
        isinstance(t, mi.LiteralType)
        and isinstance(value, str | int | float)
        and not _matches(t, value)
        and path not in redact
    ):
        # Echoing a wrong choice helps spot the typo; a value that came from the environment is never echoed.
        out.append(ConfigIssue(path, f"expected {_describe(t)}, got {value!r}"))
        return
    if not _matches(t, value):
        out.append(
            ConfigIssue(path, f"expected {_describe(t)}, got {type(value).__name__ if value is not None else 'null'}")
        )
        return
    if isinstance(t, mi.IntType | mi.FloatType):
        if isinstance(value, float) and not math.isfinite(value):
            out.append(ConfigIssue(path, f"expected {_describe(t)}, got a non-finite number"))
        elif not _in_bounds(value, t):
            out.append(ConfigIssue(path, f"expected {_describe(t)}"))
    elif isinstance(t, mi.LiteralType) and value not in t.values:
        out.append(ConfigIssue(path, f"expected {_describe(t)}"))
    elif isinstance(t, mi.ListType):
        for i, item in enumerate(value):
            _check(t.item_type, item, f"{path}[{i}]", out, redact)
    elif isinstance(t, mi.DictType):
        for k, v in value.items():
            sub = f"{path}.{k}" if path else str(k)
            if not isinstance(k, str):
                out.append(ConfigIssue(sub, "expected a string key"))
            _check(t.value_type, v, sub, out, redact)
    elif isinstance(t, mi.StructType):
        _check_struct(t, value, path, out, redact)


def _check_struct(
    t: mi.StructType, value: dict[Any, Any], path: str, out: list[ConfigIssue], redact: frozenset[str] | set[str]
) -> None:
    fields = {f.encode_name: f for f in t.fields}
    for key, item in value.items():
        sub = f"{path}.{key}" if path else str(key)
        field = fields.get(key) if isinstance(key, str) else None
        if field is None:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(fields))}"
            out.append(ConfigIssue(sub, f"unknown key{hint}"))
            continue
        _check(field.type, item, sub, out, redact)
    for name, field in fields.items():
        if field.required and name not in value:
            out.append(
                ConfigIssue(
                    f"{path}.{name}" if path else name, f"required key missing: expected {_describe(field.type)}"
                )
            )


def check_against(cls: type, raw: Any, redact: frozenset[str] | set[str] = frozenset()) -> list[ConfigIssue]:
    """Every mismatch between ``raw`` and the struct ``cls``; values at ``redact`` paths are never quoted."""
    out: list[ConfigIssue] = []
    _check(mi.type_info(cls), raw, "", out, redact)
    return out


def locate(issues: list[ConfigIssue], lines: dict[str, int]) -> list[ConfigIssue]:
    """Attach the nearest line the file has for each issue's key path (a missing key: its parent's line)."""
    for issue in issues:
        path = issue.path
        while path and path not in lines:
            path = path.rpartition(".")[0] if "." in path else path.rpartition("[")[0]
        issue.line = lines.get(path)
    return issues
