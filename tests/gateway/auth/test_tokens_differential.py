"""Our verifier and PyJWT's `decode` agree on which tokens to accept.

`gateway.auth.jws` parses and checks claims itself (for speed); this property
test holds it to PyJWT's verdict on generated claim sets and corrupted tokens.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.auth.tokens import AuthError, TokenVerifier
from gateway.settings.model import AuthSettings

SECRET = b"d" * 40
AUDIENCE = "execgate"
ISSUER = "https://idp.example"
LEEWAY_S = 30
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

# Offsets well away from the leeway boundary, so a second between the two checks never matters.
offsets = st.sampled_from([-7200, -600, -100, 100, 600, 600, 7200, 7200])


def usually(draw: st.DrawFn) -> bool:
    """True four times in five, so plenty of generated tokens are valid."""
    return draw(st.integers(0, 4)) > 0


@st.composite
def tokens(draw: st.DrawFn) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {"tenant": "acme"}
    if usually(draw):
        claims["sub"] = "svc"
    if usually(draw):
        claims["iat"] = now + draw(st.sampled_from([-600, -100, 0, 0, 0, 600]))
    if usually(draw):
        claims["exp"] = now + draw(offsets)
    if not usually(draw):
        claims["nbf"] = now + draw(offsets)
    if usually(draw):
        claims["aud"] = draw(st.sampled_from([AUDIENCE, AUDIENCE, [AUDIENCE, "x"], "other", ["x"]]))
    if usually(draw):
        claims["iss"] = draw(st.sampled_from([ISSUER, ISSUER, ISSUER, "https://evil.example"]))
    key = SECRET if usually(draw) else b"w" * 40
    token = jwt.encode(claims, key, algorithm="HS256")
    if not usually(draw):
        index = draw(st.integers(0, len(token) - 1))
        if token[index] != ".":
            token = token[:index] + draw(st.sampled_from(B64URL)) + token[index + 1 :]
    return token


def pyjwt_accepts(token: str) -> bool:
    try:
        claims = jwt.decode(
            token,
            SECRET,
            algorithms=["HS256"],
            audience=AUDIENCE,
            issuer=ISSUER,
            leeway=LEEWAY_S,
            options={"require": ["exp", "iat", "sub", "tenant"]},
        )
    except jwt.InvalidTokenError:
        return False
    return claims.get("tenant") == "acme" and claims.get("sub") == "svc"


@pytest.fixture(scope="module")
def verifier(tmp_path_factory: pytest.TempPathFactory) -> TokenVerifier:
    secret_file = Path(tmp_path_factory.mktemp("keys")) / "hs256.key"
    secret_file.write_bytes(SECRET)
    auth = AuthSettings(
        hs256_secret_file=str(secret_file),
        audience=AUDIENCE,
        issuer=ISSUER,
        leeway_s=LEEWAY_S,
        max_token_ttl_s=10**6,
    )
    v = TokenVerifier(auth)
    asyncio.run(v.start())  # local keys only: nothing bound to that loop
    return v


def ours_accepts(verifier: TokenVerifier, token: str) -> bool:
    try:
        asyncio.run(verifier.verify(token))
    except AuthError:
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(token=tokens())
def test_same_verdict_as_pyjwt(verifier: TokenVerifier, token: str) -> None:
    verdict = pyjwt_accepts(token)
    event(f"pyjwt accepts: {verdict}")
    assert ours_accepts(verifier, token) == verdict, token
