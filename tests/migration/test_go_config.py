"""The Go agent's (nodevitals) config keys, contract §1: each accepted with its Go meaning, and asserted on what it
changes (the loaded config, the file the history database lands in, what check-config prints)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nvdaemon.config import ConfigError, LoadedConfig, parse_config
from nvdaemon.history.service import history_path
from tests.history.helpers import T0, Wall, make_agent, make_sink, serving, temps


def parse(text: str, env: dict[str, str] | None = None) -> LoadedConfig:
    return parse_config(textwrap.dedent(text), "go.yaml", env={"NODE_NAME": "n1"} if env is None else env)


def issues(text: str, env: dict[str, str] | None = None) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse(text, env)
    return {i.path: i.message for i in info.value.issues}


# --- nodeExporter.textfileDir -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node_exporter", "directory"),
    [
        ("{textfileDir: /var/lib/node_exporter/textfile_collector}", "/var/lib/node_exporter/textfile_collector"),
        ("{textfileDirectory: /ours}", "/ours"),
        ("{textfileDir: /same, textfileDirectory: /same}", "/same"),
        ('{textfileDir: "", textfileDirectory: /ours}', "/ours"),
        ("{enabled: true}", ""),
    ],
)
def test_textfile_dir_is_the_textfile_directory(node_exporter: str, directory: str) -> None:
    assert parse(f"nodeExporter: {node_exporter}\n").config.node_exporter.textfile_directory == directory


def test_textfile_dir_and_textfile_directory_that_differ_are_an_error() -> None:
    found = issues("nodeExporter: {textfileDir: /a, textfileDirectory: /b}\n")
    assert list(found) == ["nodeExporter.textfileDir"]
    assert "differ" in found["nodeExporter.textfileDir"]


def test_textfile_dir_of_the_wrong_type_is_an_error() -> None:
    assert list(issues("nodeExporter: {textfileDir: [a]}\n")) == ["nodeExporter.textfileDir"]


# --- history.dataDir ----------------------------------------------------------------------------------------------


def test_history_lives_in_the_state_dir_without_data_dir(tmp_path: Path) -> None:
    loaded = parse(f"stateDir: {tmp_path}\nhistory: {{enabled: true}}\n")
    assert history_path(loaded) == tmp_path / "history.db"


async def test_history_database_is_written_in_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "var-lib-nodevitals-history"
    go_file = data_dir / "history.db"  # a Go agent's bbolt database from before the migration
    data_dir.mkdir()
    go_file.write_bytes(b"bbolt pages")
    agent = make_agent(tmp_path, history=f"{{enabled: true, dataDir: {data_dir}}}")
    sink = make_sink(agent, Wall(T0 + 400))
    async with serving(sink):
        sink.ingest(temps("gpu0", (40.0, T0 + 10)))
        assert await sink.flush() == 1
    assert sink.path.parent == data_dir
    assert sink.path.stat().st_size > 0
    assert not (tmp_path / "state" / "history.db").exists()
    assert go_file.read_bytes() == b"bbolt pages"  # left for a rollback, never opened as sqlite
    assert any("history.dataDir" in note for note in agent.loaded.notes)
