"""Our Standard Webhooks signing, checked against the reference implementation."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

from gateway.approvals.webhooks import (
    SignatureError,
    WebhookSecretError,
    headers_for,
    load_secret,
    verify,
)

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def test_reference_library_verifies_our_signature(tmp_path: Path) -> None:
    (tmp_path / "s").write_text(SECRET + "\n")
    key = load_secret(tmp_path / "s")
    body = b'{"type":"approval.requested"}'
    headers = headers_for(key, "apr_1", body)
    assert Webhook(SECRET).verify(body, headers) == {"type": "approval.requested"}


def test_we_verify_the_reference_signature() -> None:
    from datetime import UTC, datetime

    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    now = datetime.now(UTC)
    sig = Webhook(SECRET).sign("msg_1", now, '{"decision":"approve"}')
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": f"v1,AAAA {sig}",
    }
    assert verify(key, headers, b'{"decision":"approve"}', tolerance_s=300) == "msg_1"


@pytest.mark.parametrize(
    ("change", "message", "reason"),
    [
        ({"webhook-signature": "v1,AAAA"}, "no matching", "bad_signature"),
        ({"webhook-timestamp": "1000"}, "tolerance", "stale_timestamp"),
        ({"webhook-timestamp": "soon"}, "integer", "bad_timestamp"),
        ({"webhook-id": ""}, "missing", "missing_headers"),
    ],
)
def test_bad_callbacks_are_refused(change: dict[str, str], message: str, reason: str) -> None:
    key = b"k" * 32
    headers = {**headers_for(key, "m", b"{}"), **change}
    with pytest.raises(SignatureError, match=message) as exc:
        verify(key, headers, b"{}", tolerance_s=300)
    assert exc.value.reason == reason


def test_tampered_body_is_refused() -> None:
    key = b"k" * 32
    with pytest.raises(SignatureError):
        verify(
            key,
            headers_for(key, "m", b'{"decision":"deny"}'),
            b'{"decision":"approve"}',
            tolerance_s=300,
        )


@pytest.mark.parametrize(
    "content", ["", "whsec_***", "whsec_" + base64.b64encode(b"short").decode()]
)
def test_bad_secret_files(tmp_path: Path, content: str) -> None:
    (tmp_path / "s").write_text(content)
    with pytest.raises(WebhookSecretError):
        load_secret(tmp_path / "s")
    with pytest.raises(WebhookSecretError, match="no such file"):
        load_secret(tmp_path / "absent")
