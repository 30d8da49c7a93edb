"""Standard Webhooks: signing what we send and verifying what comes back.

`webhook-signature: v1,<base64 HMAC-SHA256(secret, "{id}.{timestamp}.{body}")>`, with
the secret written as `whsec_<base64>` (the convention's own format) in its file.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

PREFIX = "whsec_"


class WebhookSecretError(Exception):
    """A configured webhook secret file is missing or malformed."""


class SignatureError(Exception):
    """A callback's Standard Webhooks headers do not verify; `reason` is a stable word:
    missing_headers, bad_timestamp, stale_timestamp or bad_signature."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def load_secret(path: Path) -> bytes:
    """The key bytes of a `whsec_<base64>` (or bare base64) secret file. Blocking."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise WebhookSecretError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WebhookSecretError(f"{path}: unreadable: {exc}") from None
    text = text.removeprefix(PREFIX)
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise WebhookSecretError(f"{path}: not whsec_<base64>") from None
    if len(key) < 24:
        raise WebhookSecretError(f"{path}: secret shorter than 24 bytes")
    return key


def retryable(status: int) -> bool:
    """Whether a receiver's answer is worth another attempt."""
    return status >= 500 or status in (408, 429)


async def post_once(
    session: aiohttp.ClientSession, url: str, key: bytes, msg_id: str, body: bytes
) -> tuple[bool, bool, dict[str, Any]]:
    """One delivery attempt: (delivered, worth retrying, what to audit of it).
    Signed with `key` when there is one."""
    outcome: dict[str, Any] = {}
    headers = headers_for(key, msg_id, body) if key else {"content-type": "application/json"}
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            outcome["status_code"] = resp.status
            ok = 200 <= resp.status < 300
            return ok, not ok and retryable(resp.status), outcome
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return False, True, outcome


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def headers_for(key: bytes, msg_id: str, body: bytes, now: float | None = None) -> dict[str, str]:
    timestamp = int(time.time() if now is None else now)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(key, msg_id, timestamp, body),
        "content-type": "application/json",
    }


def verify(
    key: bytes,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: int,
    now: float | None = None,
) -> str:
    """Return the webhook id when the signature holds and the timestamp is fresh."""
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get("webhook-id", "")
    raw_ts = lowered.get("webhook-timestamp", "")
    signatures = lowered.get("webhook-signature", "")
    if not (msg_id and raw_ts and signatures):
        raise SignatureError(
            "missing_headers", "missing webhook-id, webhook-timestamp or webhook-signature"
        )
    try:
        timestamp = int(raw_ts)
    except ValueError:
        raise SignatureError("bad_timestamp", "webhook-timestamp is not an integer") from None
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise SignatureError("stale_timestamp", "webhook-timestamp outside the tolerance")
    expected = sign(key, msg_id, timestamp, body).encode()
    for candidate in signatures.split():
        if hmac.compare_digest(candidate.encode(), expected):
            return msg_id
    raise SignatureError("bad_signature", "no matching signature")
