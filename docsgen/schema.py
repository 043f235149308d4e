"""Every key of the config schema (``nvdaemon.config``), walked as ``configcheck`` walks it: its key path, type,
default, allowed range or values, and the comment written beside it in ``nvdaemon/config.py``.

A key's description is the comment lines right above it in ``nvdaemon/config.py`` followed by the comment on its
own line (read with ``inspect.getsource`` and ``tokenize``); a section's is the first paragraph of its struct's
docstring. A key with neither has an empty description.
"""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import msgspec.inspect as mi

from nvdaemon import config
from nvdaemon.configcheck import OPTIONAL, PATH_META, SOCKET, SUN_PATH_MAX


@dataclass(frozen=True)
class Key:
    path: str  # rules[].enterFor
    type: str
    default: str
    allowed: str
    description: str


@dataclass(frozen=True)
class Section:
    path: str  # "" for the top level; sinks.webhook[] for a list of mappings
    description: str
    keys: tuple[Key, ...]


def field_comments() -> dict[tuple[str, str], str]:
    """(struct class name, attribute) -> its comment in ``nvdaemon/config.py``: the trailing comment on the line the
    field starts on, after the comment lines directly above it."""
    source = inspect.getsource(config)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[tuple[str, str], str] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            above: list[str] = []
            line = stmt.lineno - 1
            while line in comments and lines[line - 1].lstrip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            trailing = [comments[stmt.lineno]] if stmt.lineno in comments else []
            text = " ".join(above + trailing).strip()
            if text:
                out[(node.name, stmt.target.id)] = text
    return out


def _unwrap(t: mi.Type) -> tuple[mi.Type, str]:
    """The type under a path marker and ``| None``, and the path kind ("" when not a path)."""
    kind = ""
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        if len(members) == 1:
            t = members[0]
    if isinstance(t, mi.Metadata):
        kind = str((t.extra or {}).get(PATH_META, ""))
        t = t.type
    return t, kind


def _number(value: float) -> str:
    return repr(value) if isinstance(value, float) and not value.is_integer() else str(int(value))


def type_name(t: mi.Type) -> str:
    t, kind = _unwrap(t)
    if kind:
        return {OPTIONAL: "path", SOCKET: "socket path"}.get(kind, "path (required)")
    if isinstance(t, mi.ListType):
        return f"list of {type_name(t.item_type)}"
    if isinstance(t, mi.DictType):
        return f"map of string to {type_name(t.value_type)}"
    if isinstance(t, mi.StructType):
        return "mapping"
    simple = {mi.StrType: "string", mi.BoolType: "bool", mi.IntType: "integer", mi.FloatType: "number"}
    if isinstance(t, mi.LiteralType):
        return "string"
    return simple.get(type(t), "value")


def allowed(t: mi.Type) -> str:
    """The range, the choices or the path rule the schema declares; "" when it declares none."""
    t, kind = _unwrap(t)
    if kind == SOCKET:
        return f"not empty; at most {SUN_PATH_MAX} bytes"
    if kind and kind != OPTIONAL:
        return "not empty"
    if isinstance(t, mi.ListType):
        return allowed(t.item_type)
    if isinstance(t, mi.DictType):
        return allowed(t.value_type)
    if isinstance(t, mi.LiteralType):
        return ", ".join(f"`{v}`" for v in t.values)
    if isinstance(t, mi.IntType | mi.FloatType):
        low = f">= {_number(t.ge)}" if t.ge is not None else f"> {_number(t.gt)}" if t.gt is not None else ""
        high = f"<= {_number(t.le)}" if t.le is not None else f"< {_number(t.lt)}" if t.lt is not None else ""
        if t.ge is not None and t.le is not None:
            return f"{_number(t.ge)} to {_number(t.le)}"
        return ", ".join(p for p in (low, high) if p)
    return ""


def _default(field: mi.Field) -> str:
    if field.required:
        return "required"
    value: Any = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int | float):
        return f"`{_number(value)}`"
    if isinstance(value, str) and value:
        return f"`{value}`"  # as written in YAML (single-quoted where it has a backslash)
    return f"`{msgspec.json.encode(value).decode()}`"


def _struct_of(t: mi.Type) -> tuple[mi.StructType, str] | None:
    """The struct a field opens as a section, and the suffix of its path (``[]`` for a list of them)."""
    t, _ = _unwrap(t)
    if isinstance(t, mi.StructType):
        return t, ""
    if isinstance(t, mi.ListType) and isinstance(t.item_type, mi.StructType):
        return t.item_type, "[]"
    return None


def sections(cls: type = config.Config) -> list[Section]:
    """Every section of the schema, depth first in declaration order, each with its own keys (not its subsections)."""
    comments = field_comments()
    out: list[Section] = []

    def walk(t: mi.StructType, path: str) -> None:
        keys: list[Key] = []
        nested: list[tuple[mi.StructType, str]] = []
        for f in t.fields:
            sub = f"{path}.{f.encode_name}" if path else f.encode_name
            opened = _struct_of(f.type)
            if opened is not None:
                nested.append((opened[0], sub + opened[1]))
                continue
            doc = comments.get((t.cls.__name__, f.name), "")
            keys.append(Key(sub, type_name(f.type), _default(f), allowed(f.type), doc))
        docstring = (t.cls.__dict__.get("__doc__") or "").strip().split("\n\n")[0]
        out.append(Section(path, " ".join(docstring.split()), tuple(keys)))
        for struct, sub in nested:
            walk(struct, sub)

    walk(mi.type_info(cls), "")  # type: ignore[arg-type]
    return out


def key_paths(cls: type = config.Config) -> Iterator[str]:
    """Every key path of the schema, sections included (``sinks``, ``sinks.webhook[]``, ``sinks.webhook[].url``)."""
    for section in sections(cls):
        if section.path:
            yield section.path
        for key in section.keys:
            yield key.path
