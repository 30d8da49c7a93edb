"""The cheap, strict half of JWT verification: compact parsing and claim checks.

PyJWT's `decode` spends most of its ~140 us per token on pure-Python
base64 checks and parses every token twice when the key depends on the header.
This module does the parsing once with C-speed primitives; signatures are
still checked by PyJWT's algorithm objects (`ALGORITHMS`), and the rules are
the same ones PyJWT applies (RFC 7519 / RFC 8725), a little stricter:

* exactly three base64url segments, no padding, canonical encoding, ASCII only;
* the header is a JSON object; `kid`, if present, is a string; `crit` and `b64`
  (extensions we do not implement) are refused;
* the payload is parsed only after the signature verified;
* `exp`, `iat`, `nbf` must be JSON numbers (PyJWT also accepts numeric strings).
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

from jwt.algorithms import Algorithm, get_default_algorithms

from gateway.auth.keys import ALLOWED_ALGORITHMS
from gateway.json_codec import loads

# Stateless signature algorithm objects, one per allowed name.
ALGORITHMS: dict[str, Algorithm] = {
    name: alg for name, alg in get_default_algorithms().items() if name in ALLOWED_ALGORITHMS
}

_BASE64URL = re.compile(rb"[A-Za-z0-9_-]*")


class AuthError(Exception):
    """The token is not acceptable; `reason` is a stable short word (see `gateway.tokens`)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Compact:
    header: dict[str, Any]
    signing_input: bytes
    payload: bytes  # decoded, not yet parsed: parse only after the signature holds
    signature: bytes


def _segment(data: bytes, what: str) -> bytes:
    if len(data) % 4 == 1 or not _BASE64URL.fullmatch(data):
        raise AuthError("malformed", f"{what} is not base64url")
    try:
        decoded = base64.urlsafe_b64decode(data + b"=" * (-len(data) % 4))
    except (binascii.Error, ValueError):
        raise AuthError("malformed", f"{what} is not base64url") from None
    if base64.urlsafe_b64encode(decoded).rstrip(b"=") != data:
        raise AuthError("malformed", f"{what} is not canonical base64url")
    return decoded


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        value = loads(data, where=what)
    except ValueError:
        raise AuthError("malformed", f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise AuthError("malformed", f"{what} is not a JSON object")
    return value


def parse_compact(token: str) -> Compact:
    try:
        raw = token.encode("ascii")
    except UnicodeEncodeError:
        raise AuthError("malformed", "not ASCII") from None
    parts = raw.split(b".")
    if len(parts) != 3:
        raise AuthError("malformed", f"{len(parts)} segments, need 3")
    header = _json_object(_segment(parts[0], "header"), "header")
    if "kid" in header and not isinstance(header["kid"], str):
        raise AuthError("malformed", "kid is not a string")
    if "crit" in header or "b64" in header:
        raise AuthError("malformed", "unsupported critical header extension")
    return Compact(
        header,
        parts[0] + b"." + parts[1],
        _segment(parts[1], "payload"),
        _segment(parts[2], "signature"),
    )


def verify_signature(compact: Compact, alg: str, prepared_key: Any) -> bool:
    try:
        return bool(ALGORITHMS[alg].verify(compact.signing_input, prepared_key, compact.signature))
    except (ValueError, TypeError):
        return False


def parse_payload(compact: Compact) -> dict[str, Any]:
    return _json_object(compact.payload, "payload")


@dataclass(frozen=True, slots=True)
class ClaimRules:
    required: tuple[str, ...]
    issuer: str
    audience: str
    leeway_s: float
    max_ttl_s: float


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise AuthError(f"bad_claim:{name}", "not a number")
    return value


def check_claims(claims: dict[str, Any], rules: ClaimRules, now: float) -> None:
    """Raise AuthError unless the (signature-verified) claims are acceptable now."""
    for name in rules.required:
        if claims.get(name) is None:
            raise AuthError(f"missing_claim:{name}")
    exp, iat, nbf = _number(claims, "exp"), _number(claims, "iat"), _number(claims, "nbf")
    if exp is not None and exp <= now - rules.leeway_s:
        raise AuthError("expired")
    for name, value in (("iat", iat), ("nbf", nbf)):
        if value is not None and value > now + rules.leeway_s:
            raise AuthError("not_yet_valid", f"{name} is in the future")
    if exp is not None and iat is not None and exp - iat > rules.max_ttl_s:
        raise AuthError("ttl_too_long", f"valid for {exp - iat:.0f}s > {rules.max_ttl_s}s")
    if rules.issuer:
        if claims.get("iss") is None:
            raise AuthError("missing_claim:iss")
        if claims["iss"] != rules.issuer:
            raise AuthError("bad_issuer")
    _check_audience(claims.get("aud"), rules.audience)
    if "jti" in claims and not isinstance(claims["jti"], str):
        raise AuthError("bad_claim:jti", "not a string")


def _check_audience(aud: Any, expected: str) -> None:
    if not expected:
        # A token addressed to someone (e.g. aud execgate:approval) is not for us.
        if aud:
            raise AuthError("bad_audience", "token has an audience, none is configured")
        return
    if not aud:
        raise AuthError("missing_claim:aud")
    audiences = [aud] if isinstance(aud, str) else aud
    if not isinstance(audiences, list) or not all(isinstance(a, str) for a in audiences):
        raise AuthError("bad_audience", "aud is not a string or a list of strings")
    if expected not in audiences:
        raise AuthError("bad_audience")
