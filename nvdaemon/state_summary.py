"""What ``nvdaemon state`` prints by default: a short plain-text summary of a ``/v1/status`` document.

``summarize(doc, now)`` is pure: it reads only the document (as ``json.load`` gives it) and ``now`` (Unix seconds,
the reader's clock), and returns lines of at most ``WIDTH`` characters, no colour. Sections: the node line
(version, readiness, uptime, config, reloads, tasks not running), tiers (ticks, last tick, duration, collector
errors), active conditions (by severity, then longest active first), sinks (state, backlog, dead letters, drops,
last error) and the newest ``max_events`` recent events.

The document may come from an older or newer agent: a missing field reads as ``?`` (a missing section says so), a
string or number where another was expected is shown as it is, any other unexpected type reads as missing, extra
fields are ignored, and nothing in it can raise (tests/test_state_summary.py checks random documents). Text from
the document is printed with control characters escaped, so an error message cannot move the terminal's cursor.
The document holds no secret (webhook endpoints are already ``host[:port]``); nothing else is printed.
"""

from __future__ import annotations

import math
from typing import Any

WIDTH = 100
MAX_EVENTS = 10
SEVERITY_RANK = {"critical": 0, "warning": 1, "info": 2}  # anything else sorts after info
MISSING = "?"
DEVICE = 44  # a device name is cut past this: a GPU UUID (GPU- and 36) and a PCI path fit


# ---- reading fields without trusting their types ----------------------------------------------------------------
def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _num(value: object) -> float | None:
    """A finite number (bool is not one), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _count(value: object) -> int | None:
    n = _num(value)
    return int(n) if n is not None and n >= 0 else None


def _text(value: object, limit: int = WIDTH) -> str:
    """A document value as printable text: strings with control characters escaped, numbers as short as they read,
    anything else (or nothing) as ``?``."""
    if isinstance(value, str):
        out = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in value[:limit])
    elif (n := _num(value)) is not None:
        out = f"{n:g}"
    else:
        return MISSING
    return out if len(out) <= limit else out[: max(0, limit - 3)] + "..."


def human_duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``4d03h``: two units at most; under a second in ms (``2.3ms``, ``250ms``)."""
    if not math.isfinite(seconds):
        return MISSING
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:.1f}ms" if ms < 10 else f"{ms:.0f}ms"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _ago(stamp: object, now: float) -> str:
    """``4s ago`` from a Unix time in the document; ``?`` when it is not one; ``just now`` when it is ahead of
    ``now`` (the reader's clock is behind the agent's)."""
    t = _num(stamp)
    if t is None:
        return MISSING
    age = now - t
    return "just now" if age < 1 else f"{human_duration(age)} ago"


def _since(stamp: object, now: float) -> str:
    t = _num(stamp)
    return MISSING if t is None else human_duration(max(0.0, now - t))


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    """Rows as lines, every column but the last padded to its widest cell (cells are already cut to length). A row
    too wide for ``WIDTH`` has its last cell on a line of its own below it, indented further, rather than cut."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)] if rows else []
    lines: list[str] = []
    for row in rows:
        head = indent + "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True))
        if len(head) + 2 + len(row[-1]) <= WIDTH:
            lines.append(f"{head}  {row[-1]}")
        else:
            lines += [head.rstrip(), f"{indent}    {row[-1]}"]
    return lines


def _fit(line: str) -> str:
    return line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."


# ---- sections ---------------------------------------------------------------------------------------------------
def _header(doc: dict[str, Any], now: float) -> list[str]:
    ready = doc.get("ready")
    readiness = "READY" if ready is True else "NOT READY (see /readyz)" if ready is False else "readiness ?"
    line = f"node {_text(doc.get('node'), 40)}  nvdaemon {_text(doc.get('version'), 20)}  {readiness}"
    lines = [f"{line}  up {_since(doc.get('startedAt'), now)}"]
    reloads = _dict(doc.get("reloads"))
    lines.append(
        f"config {_text(doc.get('config'), 60)}"
        f"  reloads {_text(reloads.get('ok'))} ok, {_text(reloads.get('rejected'))} rejected"
    )
    tasks = doc.get("tasks")
    if not isinstance(tasks, dict):
        return [*lines, "tasks  ? (not in the document)"]
    running = [n for n, t in tasks.items() if _dict(t).get("state") == "running" and not _dict(t).get("degraded")]
    lines.append(f"tasks  {len(running)} of {len(tasks)} running")
    for name, task in sorted(tasks.items()):
        t = _dict(task)
        if name in running:
            continue
        state = "degraded" if t.get("degraded") else _text(t.get("state"), 12)
        restarts = _count(t.get("restarts"))
        lines.append(f"  {_text(name, 40)}  {state}" + (f", {restarts} restarts" if restarts else ""))
        if t.get("lastError") is not None:
            lines.append(f"    last error ({_ago(t.get('lastErrorAt'), now)}): {_text(t.get('lastError'))}")
    return lines


def _tiers(doc: dict[str, Any], now: float) -> list[str]:
    tiers = doc.get("tiers")
    if not isinstance(tiers, dict):
        return ["Tiers: ? (not in the document)"]
    if not tiers:
        return ["Tiers: none has collected yet"]
    lines = ["Tiers"]
    pad = min(12, max(len(_text(name, 12)) for name in tiers))
    for name, tier in sorted(tiers.items()):
        t = _dict(tier)
        took = _num(t.get("durationSeconds"))
        interval = _num(t.get("intervalSeconds"))
        every = f" every {human_duration(interval)}" if interval is not None else ""
        line = (
            f"  {_text(name, 12):<{pad}}  ticks {_text(t.get('ticks'))}{every}, last {_ago(t.get('collectedAt'), now)}"
        )
        last = _num(t.get("collectedAt"))
        if last is not None and interval and now - last > 3 * interval and now - last >= 1:
            line += " (overdue)"
        line += f", took {human_duration(took) if took is not None else MISSING}, {_text(t.get('samples'))} samples"
        collectors = t.get("collectors")
        if not isinstance(collectors, dict):
            lines.append(line + ", collectors ?")
            continue
        failing = {n: _dict(c) for n, c in collectors.items() if _dict(c).get("success") is not True}
        # Absent: the source does not exist on this node, which is not an error (no error text either).
        absent = [n for n, c in failing.items() if c.get("present") is False and not _list(c.get("errors"))]
        bad = {n: c for n, c in failing.items() if n not in absent}
        if not failing:
            lines.append(f"{line}, {len(collectors)} collectors ok")
            continue
        lines.append(line)
        counts = [f"{len(collectors) - len(failing)} ok"]
        counts += [f"{len(bad)} failing"] if bad else []
        counts += [f"{len(absent)} absent"] if absent else []
        lines.append("    collectors: " + ", ".join(counts))
        for cname, c in sorted(bad.items()):
            errors = _list(c.get("errors"))
            total = _count(c.get("errorTotal"))
            first = _text(errors[0]) if errors else "no error text"
            more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
            lines.append(f"    {_text(cname, 24)}: {first}{more}, {total if total is not None else '?'} errors in all")
    return lines


def _sort_key(entry: dict[str, Any]) -> tuple[int, float]:
    started = _num(entry.get("startedAt"))
    return SEVERITY_RANK.get(str(entry.get("severity")), len(SEVERITY_RANK)), started if started is not None else 0


def _conditions(doc: dict[str, Any], now: float) -> list[str]:
    conditions = doc.get("conditions")
    if not isinstance(conditions, list):
        return ["Conditions: ? (not in the document)"]
    if not conditions:
        return ["Conditions: none active"]
    rows: list[list[str]] = []
    for c in sorted((_dict(c) for c in conditions), key=_sort_key):
        what = f"value {_text(c.get('value'))} (threshold {_text(c.get('threshold'))})"
        if c.get("stale") is True:  # its tier stopped reporting the metric: the value may be old
            what = f"STALE (last seen {_ago(c.get('lastSeen'), now)}), {what}"
        active = f"active {_since(c.get('startedAt'), now)}"
        rows.append(
            [_text(c.get("severity"), 8), _text(c.get("condition"), 32), _text(c.get("device"), DEVICE), active, what]
        )
    return [f"Conditions ({len(conditions)} active)", *_table(rows)]


def _sink_lines(name: str, sink: dict[str, Any], bus_dropped: object, now: float) -> list[str]:
    parts: list[str] = []
    state = sink.get("state", sink.get("socketState"))
    if isinstance(state, str):
        parts.append(_text(state, 30))
    if isinstance(sink.get("clients"), int):
        parts.append(f"{_text(sink['clients'])} clients")
    for key in ("backlog", "pending"):  # a webhook endpoint's spool; NVSentinel's health events not yet sent
        if key in sink:
            parts.append(f"{key} {_text(sink.get(key))}")
    if _count(sink.get("unspooled")):  # held in memory only: the spool refused them
        parts.append(f"{_text(sink['unspooled'])} unspooled")
    if _count(sink.get("deadLetters")):
        parts.append(f"{_text(sink['deadLetters'])} dead letters")
    dropped = sum(n for n in map(_count, _dict(sink.get("dropped")).values()) if n)
    dropped += _count(bus_dropped) or 0
    if dropped:
        parts.append(f"{dropped} dropped")
    lines = [f"  {name}  {', '.join(parts)}" if parts else f"  {name}"]
    for key, label in (("disabledReason", "disabled"), ("storageError", "storage error"), ("lastError", "last error")):
        if sink.get(key) is not None:
            when = f" ({_ago(sink.get('lastErrorAt'), now)})" if key == "lastError" and "lastErrorAt" in sink else ""
            lines.append(f"    {label}{when}: {_text(sink.get(key))}")
    return lines


def _sinks(doc: dict[str, Any], now: float) -> list[str]:
    sinks = doc.get("sinks")
    if not isinstance(sinks, dict):
        return ["Sinks: ? (not in the document)"]
    if not sinks:
        return ["Sinks: none (metrics and the API only)"]
    bus = _dict(_dict(doc.get("bus")).get("dropped"))
    lines = ["Sinks"]
    for name, sink in sorted(sinks.items()):
        lines += _sink_lines(_text(name, 40), _dict(sink), bus.get(name), now)
    return lines


def _event_row(ev: dict[str, Any], now: float) -> list[str]:
    exit_ = ev.get("phase") == "EXIT"
    when = _ago(ev.get("ended_at") if exit_ and ev.get("ended_at") is not None else ev.get("started_at"), now)
    detail = _dict(ev.get("detail"))
    if "xid" in detail:
        what = f"xid={_text(detail.get('xid'))} {_text(detail.get('description'), 40)}"
    else:
        what = f"value {_text(detail.get('value'))} (threshold {_text(detail.get('threshold'))})"
    phase, severity = _text(ev.get("phase"), 5), _text(ev.get("severity"), 8)
    return [when, phase, severity, _text(ev.get("condition"), 32), _text(ev.get("device"), DEVICE), what]


def _events(doc: dict[str, Any], now: float, limit: int) -> list[str]:
    events = doc.get("recentEvents")
    if not isinstance(events, list):
        return ["Recent events: ? (not in the document)"]
    if not events:
        return ["Recent events: none since start"]
    shown = events[::-1][:limit]  # the document lists them oldest first; the newest matter most
    lines = [f"Recent events (newest first, {len(shown)} of {len(events)})"]
    lines += _table([_event_row(_dict(ev), now) for ev in shown])
    if len(events) > len(shown):
        lines.append(f"  ... and {len(events) - len(shown)} more (nvdaemon state --json, or nvdaemon tail)")
    return lines


def summarize(doc: object, now: float, max_events: int = MAX_EVENTS) -> str:
    """The summary of one ``/v1/status`` document at ``now`` (Unix seconds): text lines, each at most ``WIDTH``
    characters, ending in a newline."""
    if not isinstance(doc, dict):
        return _fit(f"not a status document: the agent answered a JSON {type(doc).__name__}") + "\n"
    lines = _header(doc, now)
    for section in (_tiers, _conditions, _sinks):
        lines += ["", *section(doc, now)]
    lines += ["", *_events(doc, now, max(0, max_events))]
    return "\n".join(_fit(line) for line in lines) + "\n"
