"""The Go agent's (nodevitals) config keys, folded into ours on the raw YAML tree before it is type-checked.

Every key the Go agent knows is accepted with its Go meaning (contract §1); where ours has its own name for the
same thing (``nodeExporter.textfileDir`` is our ``textfileDirectory``) both are accepted and, when both are set,
they must agree. ``normalise`` works on the parsed, ``${VAR}``-expanded tree, acts only on values of the right
type (a wrong type is reported by the struct check) and returns the problems it found plus one note line per
place where the file means something the Go agent would do differently, which ``check-config`` prints.
Values are never quoted in issues or notes: they may be secrets.
"""

from __future__ import annotations

from typing import Any

from nvdaemon.configcheck import ConfigIssue

HISTORY_FILE_IN_DATA_DIR = "nvdaemon-history.db"  # the Go agent's bbolt file there is history.db: left untouched


def _section(tree: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = tree.get(key)
    return value if isinstance(value, dict) else None


def _set_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _node_exporter(raw: dict[str, Any], issues: list[ConfigIssue], notes: list[str]) -> None:
    ne = _section(raw, "nodeExporter")
    if ne is None:
        return
    go_dir, ours = ne.get("textfileDir"), ne.get("textfileDirectory")
    if _set_str(go_dir):
        if _set_str(ours) and ours != go_dir:
            issues.append(
                ConfigIssue(
                    "nodeExporter.textfileDir",
                    "textfileDir (the Go agent's name) and textfileDirectory are both set and differ: give one",
                )
            )
        else:
            ne["textfileDirectory"] = go_dir


def _history(raw: dict[str, Any], notes: list[str]) -> None:
    history = _section(raw, "history")
    if history is None:
        return
    if _set_str(history.get("dataDir")):
        notes.append(
            f"history.dataDir: history is kept in {HISTORY_FILE_IN_DATA_DIR} in that directory; a Go agent's "
            "history.db there is left as it is and not read"
        )


def normalise(raw: dict[str, Any]) -> tuple[list[ConfigIssue], list[str]]:
    """Fold the Go keys of ``raw`` into ours, in place; returns (issues, notes)."""
    issues: list[ConfigIssue] = []
    notes: list[str] = []
    _node_exporter(raw, issues, notes)
    _history(raw, notes)
    return issues, notes
