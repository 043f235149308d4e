"""A Go agent's ``whsec_`` secret that is not base64 (``whsec_my-team-secret``): the Go agent signed with the whole
string as the key. check-config accepts it with a note naming the key (never the value) and the signatures verify
with that raw key; a base64 ``whsec_`` secret still verifies with the Standard Webhooks reference library."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from nvdaemon.sinks.webhook import signing
from tests.sinks.helpers import event, hook, running, until
from tests.sinks.receiver import Receiver

ROOT = Path(__file__).resolve().parents[2]
GO_SECRET = "whsec_my-team-secret"

CONFIG = """\
node: go-node
sinks:
  webhook:
    - url: https://your-backend.example/hooks/hardware
      secret: ${WEBHOOK_SECRET_0}
"""


def test_check_config_accepts_a_go_whsec_secret_with_a_note(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    env = {**{k: v for k, v in os.environ.items() if k != "NODE_NAME"}, "WEBHOOK_SECRET_0": GO_SECRET}
    done = subprocess.run(
        [sys.executable, "-m", "nvdaemon", "check-config", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    notes = [n for n in done.stdout.splitlines() if n.startswith(f"{config}: note: sinks.webhook[0].secret:")]
    assert len(notes) == 1, done.stdout
    assert "Standard Webhooks receivers will not verify it" in notes[0]
    assert "whsec_ + the base64 of 24-64 random bytes" in notes[0]
    assert "my-team-secret" not in done.stdout + done.stderr


async def test_a_go_whsec_secret_signs_deliveries_with_the_whole_string(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Delivered to a real receiver on loopback; the signature is recomputed here with hmac, not with our code."""
    caplog.set_level(logging.DEBUG)
    with Receiver() as rx:
        async with running(tmp_path, hook(rx.url, secret=GO_SECRET)) as (sink, bus):
            bus.publish(event(1))
            await until(lambda: sink.attempts.get("success") == 1)
    [got] = rx.received
    signed = got.headers["webhook-id"].encode() + b"." + got.headers["webhook-timestamp"].encode() + b"." + got.body
    expected = hmac.new(GO_SECRET.encode(), signed, hashlib.sha256).digest()
    assert got.headers["webhook-signature"] == "v1," + base64.b64encode(expected).decode()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "whsec_" in r.getMessage()]
    assert len(warnings) == 1 and "Standard Webhooks receivers will not verify it" in warnings[0].getMessage()
    assert "my-team-secret" not in caplog.text


def test_a_base64_whsec_secret_still_verifies_with_standard_webhooks() -> None:
    secret = "whsec_" + base64.b64encode(b"a proper key of thirty-two bytes").decode()
    body = b'{"type":"com.nvidia.nvdaemon.test"}'
    ts = int(time.time())
    headers = signing.sign_headers([signing.decode_secret(secret)], "msg_2", ts, body)
    Webhook(secret).verify(body, headers)  # raises WebhookVerificationError on a mismatch
