"""``sinks.webhook[]`` config: https or loopback, one secret source, readable secretFile, headers; the CLI."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nvdaemon import cli
from nvdaemon.config import ConfigError
from nvdaemon.configload import parse_config
from nvdaemon.sinks.webhook.spool import FILE, SpoolDB

from .helpers import SECRET
from .receiver import Receiver

ROOT = Path(__file__).resolve().parents[2]


def issues(hook_yaml: str) -> dict[str, str]:
    text = "sinks:\n  webhook:\n" + textwrap.indent(textwrap.dedent(hook_yaml), "    ")
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.yaml", env={})
    assert "TOPSECRET" not in str(info.value)
    return {i.path: i.message for i in info.value.issues}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://backend.example/hook", "http"),
        ("https:///no-host", "valid host"),
        ("https://bad host.example/", "valid host"),
        ("https://backend.example:99999/", "port"),
        ("https://backend.example/#frag", "fragment"),
        ("not a url TOPSECRET", "http"),
    ],
)
def test_invalid_urls_are_config_errors(url: str, why: str) -> None:
    found = issues(f"- url: '{url}'\n")
    assert why in found["sinks.webhook[0].url"]


@pytest.mark.parametrize(
    "hook",
    [
        "- url: https://backend.example/hook\n",
        "- url: http://127.0.0.1:8080/hook\n",
        "- url: http://localhost/hook\n",
        "- url: http://[::1]:9/hook\n",
        "- {url: 'http://backend.internal/hook', allowInsecure: true}\n",
    ],
)
def test_accepted_urls(hook: str) -> None:
    parse_config("sinks:\n  webhook:\n" + textwrap.indent(hook, "    "), "t.yaml", env={})


def test_plain_http_to_a_remote_host_is_refused_when_allow_insecure_is_false() -> None:
    found = issues("- {url: 'http://backend.example/hook', allowInsecure: false}\n")
    assert "https://" in found["sinks.webhook[0].url"]


def test_plain_http_to_a_remote_host_is_accepted_as_in_go_with_a_note() -> None:
    """The Go agent posts to any http:// URL: a migrated config must start, and check-config says what it means."""
    loaded = parse_config("sinks:\n  webhook:\n    - url: http://backend.example/hook\n", "t.yaml", env={})
    assert loaded.config.sinks.webhook[0].allow_insecure is True
    assert any("sinks.webhook[0].url: plain http://" in note for note in loaded.notes)
    quiet = parse_config(
        "sinks:\n  webhook:\n    - {url: http://backend.example/hook, allowInsecure: true}\n", "t.yaml", env={}
    )
    assert not any("plain http://" in note for note in quiet.notes)


def test_only_one_secret_source() -> None:
    found = issues("- {url: 'https://a.example/', secret: TOPSECRET-a, secrets: [TOPSECRET-b]}\n")
    assert "only one of" in found["sinks.webhook[0]"]


def test_non_base64_whsec_secret_is_noted_by_key_not_shown() -> None:
    """The Go agent's form: used as the whole string's bytes, with a note naming the key, never the value."""
    loaded = parse_config(
        "sinks:\n  webhook:\n    - {url: 'https://a.example/', secrets: ['whsec_TOPSECRET!!']}\n", "t.yaml", env={}
    )
    assert loaded.config.sinks.webhook[0].secrets == ["whsec_TOPSECRET!!"]
    [note] = [n for n in loaded.notes if n.startswith("sinks.webhook[0].secrets[0]:")]
    assert "not base64" in note
    assert "TOPSECRET" not in "\n".join(loaded.notes)


def test_unreadable_or_bad_secret_file_names_the_key_not_the_content(tmp_path: Path) -> None:
    found = issues(f"- {{url: 'https://a.example/', secretFile: '{tmp_path / 'missing'}'}}\n")
    assert "cannot read the secret file" in found["sinks.webhook[0].secretFile"]
    go_form = tmp_path / "go-form"
    go_form.write_text("whsec_TOPSECRET%%%\n")
    text = f"sinks:\n  webhook:\n    - {{url: 'https://a.example/', secretFile: '{go_form}'}}\n"
    notes = parse_config(text, "t.yaml", env={}).notes
    assert any(n.startswith("sinks.webhook[0].secretFile (line 1): not base64") for n in notes)
    assert "TOPSECRET" not in "\n".join(notes)


def test_headers_the_agent_sets_cannot_be_overridden() -> None:
    found = issues("- {url: 'https://a.example/', headers: {webhook-id: x, Content-Type: y, 'bad name': z}}\n")
    assert set(found) == {
        "sinks.webhook[0].headers.webhook-id",
        "sinks.webhook[0].headers.Content-Type",
        "sinks.webhook[0].headers",
    }


def test_defaults() -> None:
    loaded = parse_config("sinks: {webhook: [{url: 'https://a.example/'}]}\n", "t.yaml", env={})
    (h,) = loaded.config.sinks.webhook
    assert (h.timeout_seconds, h.max_age_hours, h.max_attempts, h.mode) == (15.0, 72.0, 3, "structured")
    assert (h.backoff_base_seconds, h.backoff_max_seconds, h.allow_insecure) == (1.0, 300.0, False)


def test_run_with_an_invalid_url_exits_2_instead_of_crash_looping(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        f"stateDir: {tmp_path}\nsinks:\n  webhook:\n"
        "    - {url: http://backend.example/TOPSECRET, allowInsecure: false}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "nvdaemon", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert f"{config}:4: sinks.webhook[0].url: expected an https:// URL" in proc.stderr
    assert "TOPSECRET" not in proc.stderr


def test_spool_list_and_retry_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"stateDir: {tmp_path}\n")
    assert cli.main(["spool", "list", "--config", str(config)]) == 0
    assert "no spool" in capsys.readouterr().err
    db = SpoolDB(tmp_path / FILE)
    body = b'{"id":"e1","node":"n","tier":"core","device":"sda","condition":"smart_failing","phase":"ENTER",'
    body += b'"severity":"critical","seq":1,"started_at":0.0}'
    db.add("webhook:a.example", [("e1", 2, body), ("e2", 0, b"{}")], 10, 10**6)
    db.bury("webhook:a.example", db.rows()[0].seq, "e1", 3, "rejected", "HTTP 400")
    db.disable("webhook:a.example", "h", "HTTP 410")
    assert cli.main(["spool", "list", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "e1" in out and "dead:rejected" in out and "sda/smart_failing ENTER" in out and "HTTP 400" in out
    assert "2 event(s): 1 pending, 1 dead letter(s)" in out
    assert "endpoint webhook:a.example disabled" in out
    assert cli.main(["spool", "retry", "--config", str(config), "e1"]) == 0
    assert "1 dead letter(s) queued for delivery again; 1 disabled endpoint(s) enabled" in capsys.readouterr().out
    assert db.rows(1) == [] and db.disabled("webhook:a.example", "h") is None


def test_webhook_test_command_sends_one_signed_event(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    secret_file = tmp_path / "s"
    secret_file.write_text(SECRET + "\n")
    with Receiver(secret=SECRET) as rx:
        code = cli.main(["webhook", "test", rx.url, "--secret-file", str(secret_file), "--node", "n9"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "HTTP 200 OK" in out
    (r,) = rx.received
    assert r.verified and r.attributes["source"] == "nodevitals/n9" and r.data["condition"] == "webhook_test"
    assert SECRET not in out
    with Receiver(secret=SECRET) as rx:
        rx.default = 401
        assert cli.main(["webhook", "test", rx.url]) == 1  # unsigned: the receiver refuses it
    assert "HTTP 401" in capsys.readouterr().out
    assert cli.main(["webhook", "test", "http://backend.example/"]) == 2


def test_a_secret_file_is_read_within_a_limit(tmp_path: Path) -> None:
    """A secretFile pointing at something huge (a log, a device) is refused at its key, never read whole; one that
    is not UTF-8 is a clear error too, not a traceback."""
    from nvdaemon.config import WebhookSink
    from nvdaemon.sinks.webhook.config import MAX_SECRET_FILE_BYTES, SecretFileTooLarge
    from nvdaemon.sinks.webhook.http import load_keys

    huge = tmp_path / "huge"
    huge.write_bytes(b"TOPSECRET" + b"x" * (MAX_SECRET_FILE_BYTES + 1))
    found = issues(f"- {{url: 'https://a.example/', secretFile: '{huge}'}}\n")
    assert f"larger than {MAX_SECRET_FILE_BYTES} bytes" in found["sinks.webhook[0].secretFile"]
    with pytest.raises(SecretFileTooLarge):
        load_keys(WebhookSink(url="https://a.example/", secret_file=str(huge)))
    latin = tmp_path / "latin"
    latin.write_bytes(b"caf\xe9 secret of some length\n")
    found = issues(f"- {{url: 'https://a.example/', secretFile: '{latin}'}}\n")
    assert "cannot read the secret file: UnicodeDecodeError" in found["sinks.webhook[0].secretFile"]
    fits = tmp_path / "fits"
    fits.write_text("whsec_" + "A" * 40 + "\n\nraw-secret-of-enough-length-here\n")
    assert load_keys(WebhookSink(url="https://a.example/", secret_file=str(fits))) == [
        "whsec_" + "A" * 40,
        "raw-secret-of-enough-length-here",
    ]
