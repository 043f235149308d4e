"""Validate a parsed YAML tree against msgspec struct types and collect *every* problem, not just the first.

msgspec stops at the first error; operators fixing a config on a node want the whole list, each with the key path,
the line in the file and what was expected. This walks the tree against ``msgspec.inspect`` type info. Values are
not echoed (they may be secrets), only key names and the allowed choices; the one exception is a wrong choice for a
key with fixed choices (``tier: tpu``), quoted to show the typo: at most ``ECHO_MAX`` characters of it, and never a
value that came from the environment.

YAML input is bounded before anything walks it (``load_yaml``): at most ``MAX_DEPTH`` nested collections, and
aliases may bring in at most ``MAX_ALIAS_NODES`` nodes in all (a 300-byte "billion laughs" file would otherwise
expand to hundreds of millions); an alias to a collection that contains it is refused.

A string key the schema marks as a path (``PATH_META`` in its ``msgspec.Meta(extra=...)``: config.py's ``FilePath``,
``RequiredPath``, ``SocketPath``) is also checked for what no system call can take (``path_problem``): a NUL byte,
a character the filesystem encoding cannot hold, more than the kernel's length limits. Such a value would pass as a
string and make every ``open``/``stat``/``connect`` on it raise ``ValueError``, far from the config, in a task that
then crash-loops; here it is one more error at its key path, found by ``check-config``, ``run`` and a reload alike.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import msgspec.inspect as mi
import yaml

# ``${VAR}`` in a config string: read from the environment after parsing (config.py), checked for Go's rules
# (goconfig.py). One pattern for both.
ENV_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass
class ConfigIssue:
    path: str
    message: str
    line: int | None = None

    def where(self) -> str:
        return f":{self.line}" if self.line is not None else ""


MAX_DEPTH = 64  # nested mappings/lists; a real config needs about 8
ECHO_MAX = 24  # characters of a wrong choice quoted in its error: a typo of a choice is short
MAX_ALIAS_NODES = 10_000  # nodes brought in by all aliases together, each counted with everything under it


# What a path-valued key is, in ``msgspec.Meta(extra={PATH_META: kind})``: OPTIONAL may be "" (unset, a default or
# off), REQUIRED may not, SOCKET names a Unix socket and may not be "" either.
PATH_META = "path"
OPTIONAL, REQUIRED, SOCKET = "optional", "required", "socket"
PATH_MAX = 4096  # Linux, with the terminating NUL: a longer path fails every system call with ENAMETOOLONG
NAME_MAX = 255  # bytes of one path component (every Linux filesystem the agent reads or writes)
SUN_PATH_MAX = 107  # bytes of a Unix socket path: sockaddr_un.sun_path is 108 with its NUL (gRPC requires the NUL)


def path_problem(value: str, kind: str = OPTIONAL) -> str | None:
    """Why ``value`` cannot name a file, directory or socket (None: it can, as far as its text goes); ``kind`` is
    OPTIONAL, REQUIRED or SOCKET. The message never quotes the value (a path given through ${VAR} is redacted like
    every other value)."""
    if value == "":
        return None if kind == OPTIONAL else "must not be empty: expected a path"
    if "\0" in value:
        return "contains a NUL byte, which no path can hold"
    try:
        encoded = os.fsencode(value)
    except UnicodeEncodeError:
        return "contains a character the filesystem encoding cannot hold (an unpaired UTF-16 surrogate)"
    if len(encoded) >= PATH_MAX:
        return f"longer than {PATH_MAX - 1} bytes (PATH_MAX): no system call takes it"
    if any(len(part) > NAME_MAX for part in encoded.split(b"/")):
        return f"has a component longer than {NAME_MAX} bytes (NAME_MAX): no system call takes it"
    if kind == SOCKET and len(encoded) > SUN_PATH_MAX:
        return f"longer than {SUN_PATH_MAX} bytes, the most a Unix socket path can have (sockaddr_un)"
    return None


class InputLimitError(Exception):
    """The YAML text is beyond a limit (nesting, alias expansion); ``line`` is 1-based where known."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with its composer bounded: depth counted on the way down, and the expanded size of
    every collection recorded on the way up, so an alias costs the size of what it refers to."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> nodes in it, aliases expanded
        self._aliased = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        line = event.start_mark.line + 1 if event.start_mark is not None else None
        if isinstance(event, yaml.AliasEvent):
            target = self.anchors.get(event.anchor)
            if target is not None:
                size = self._sizes.get(id(target))
                if size is None:  # its anchor is still being composed: the alias is inside what it names
                    raise InputLimitError(f"alias *{event.anchor} refers to a collection that contains it", line)
                self._aliased += size
                if self._aliased > MAX_ALIAS_NODES:
                    raise InputLimitError(f"aliases expand to more than {MAX_ALIAS_NODES} values", line)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise InputLimitError(f"nested more than {MAX_DEPTH} levels deep", line)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes.get(id(c), 1) for c in children)
        return node


def load_yaml(text: str) -> tuple[Any, dict[str, int], list[ConfigIssue]]:
    """Parse YAML text once, within ``MAX_DEPTH`` and ``MAX_ALIAS_NODES``: the data, the line of each key path and
    the keys given twice (see ``yaml_index``). Raises ``yaml.YAMLError`` or ``InputLimitError``."""
    loader = _BoundedLoader(text)
    try:
        root = loader.get_single_node()
        lines, duplicates = yaml_index(root)  # before construction, which merges `<<` keys into the nodes
        data = loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()
    return data, lines, duplicates


def yaml_index(root: yaml.Node | None) -> tuple[dict[str, int], list[ConfigIssue]]:
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

    if root is not None:
        walk(root, "")
    return lines, duplicates


def _describe(t: mi.Type) -> str:
    if isinstance(t, mi.Metadata):
        return "a path" if (t.extra or {}).get(PATH_META) else _describe(t.type)
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
    if isinstance(t, mi.Metadata):
        return _matches(t.type, value)
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
    if isinstance(t, mi.Metadata):
        kind = (t.extra or {}).get(PATH_META)
        if kind and isinstance(value, str):
            if why := path_problem(value, kind):
                out.append(ConfigIssue(path, why))
            return
        _check(t.type, value, path, out, redact)
        return
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
        # Echoing a wrong choice helps spot the typo; a value that came from the environment is never echoed, and a
        # long one only in part (a value pasted into the wrong key may be a secret, or a whole file).
        shown = value if not isinstance(value, str) or len(value) <= ECHO_MAX else value[:ECHO_MAX] + "..."
        out.append(ConfigIssue(path, f"expected {_describe(t)}, got {shown!r}"))
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
