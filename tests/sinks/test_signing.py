"""Standard Webhooks signing, checked against the reference ``standardwebhooks`` library and a fixed vector."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from nvdaemon.sinks.webhook import signing

# The example of the Standard Webhooks specification's reference test suites.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TS = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def now() -> int:
    return int(dt.datetime.now(dt.UTC).timestamp())


def test_spec_vector() -> None:
    key = signing.decode_secret(SPEC_SECRET)
    assert signing.signature(key, SPEC_ID, SPEC_TS, SPEC_BODY) == SPEC_SIG


@pytest.mark.parametrize(
    ("secret", "key"),
    [
        ("whsec_c2VjcmV0", b"secret"),
        ("whsec_c2VjcmV0MQ", b"secret1"),  # unpadded base64 is accepted, as the reference libraries do
        ("plain-text-secret", b"plain-text-secret"),  # the Go agent's raw form
        ("whsecret", b"whsecret"),  # no underscore: not the prefix
    ],
)
def test_decode_secret(secret: str, key: bytes) -> None:
    assert signing.decode_secret(secret) == key


def test_an_empty_secret_is_rejected() -> None:
    with pytest.raises(signing.SecretError):
        signing.decode_secret("")


@pytest.mark.parametrize("secret", ["whsec_", "whsec_not base64!", "whsec_%%%%", "whsec_my-team-secret"])
def test_a_whsec_secret_that_is_not_base64_is_the_go_agents_raw_key(secret: str) -> None:
    assert signing.decode_secret(secret) == secret.encode("utf-8")
    assert signing.is_go_raw_whsec(secret)
    assert not signing.is_weak(secret)  # it has its own start warning


def test_a_base64_whsec_secret_is_not_the_raw_form() -> None:
    assert not signing.is_go_raw_whsec(SPEC_SECRET)
    assert not signing.is_go_raw_whsec("plain-text-secret")


@pytest.mark.parametrize(
    ("secret", "weak"),
    [("short", True), ("x" * 23, True), ("x" * 24, False), ("whsec_c2VjcmV0", False)],
)
def test_weak_raw_secrets(secret: str, weak: bool) -> None:
    assert signing.is_weak(secret) is weak


@given(
    raw=st.binary(min_size=1, max_size=64),
    msg_id=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40),
    body=st.text(max_size=300),
)
def test_reference_library_verifies_every_signature(raw: bytes, msg_id: str, body: str) -> None:
    secret = "whsec_" + base64.b64encode(raw).decode()
    ts = now()
    data = body.encode()
    headers = signing.sign_headers([signing.decode_secret(secret)], msg_id, ts, data)
    Webhook(secret).verify(data, headers, json_parse=False)
    assert signing.verify([raw], headers, data)


def test_rotation_one_signature_per_key_each_verifies() -> None:
    new, old = "whsec_" + base64.b64encode(b"n" * 32).decode(), "whsec_" + base64.b64encode(b"o" * 32).decode()
    other = "whsec_" + base64.b64encode(b"x" * 32).decode()
    body = b'{"a":1}'
    headers = signing.sign_headers([signing.decode_secret(new), signing.decode_secret(old)], "id1", now(), body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(new).verify(body, headers)
    Webhook(old).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(body + b" ", headers)  # over the exact bytes


def test_unsigned_endpoint_has_no_signature_header() -> None:
    headers = signing.sign_headers([], "id1", 5, b"")
    assert headers == {"webhook-id": "id1", "webhook-timestamp": "5"}
    assert not signing.verify([b"k"], headers, b"")
