"""Log lines: one per record, JSON when asked, the event carried as structured data."""

from __future__ import annotations

import json
import logging

import pytest

from nvdaemon import logs


def test_json_format_one_line_per_record_with_extra(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup("json", "info")
    log = logging.getLogger("nvdaemon.events")
    log.info("event %s", "ENTER", extra={"event": {"id": "abc", "phase": "ENTER"}})
    log.error("multi\nline")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["msg"] == "event ENTER" and first["event"]["id"] == "abc" and first["level"] == "info"
    assert second["msg"] == "multi\nline" and first["time"].endswith("Z")


def test_text_format_keeps_a_record_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    logs.setup("text", "info")
    logging.getLogger("nvdaemon").warning("first\nsecond")
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "\n | second" in err
    logging.getLogger().handlers.clear()
