"""JWKS keys from a real aiohttp server on 127.0.0.1: fetch, rotation, rate limit, staleness."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from gateway.auth.tokens import AuthError, TokenVerifier
from gateway.settings.model import AuthSettings

MIN_INTERVAL_S = 10.0
CACHE_S = 300


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class JwksServer:
    """Serves `keys` as a JWKS document and counts requests."""

    def __init__(self) -> None:
        self.keys: list[dict[str, Any]] = []
        self.status = 200
        self.hits = 0
        self.private: dict[str, Any] = {}

    def add(self, kid: str, alg: str = "RS256", **jwk_extra: Any) -> None:
        if alg == "RS256":
            key: Any = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            jwk = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
        elif alg == "ES256":
            key = ec.generate_private_key(ec.SECP256R1())
            jwk = ECAlgorithm.to_jwk(key.public_key(), as_dict=True)
        else:
            key = ed25519.Ed25519PrivateKey.generate()
            jwk = OKPAlgorithm.to_jwk(key.public_key(), as_dict=True)
        self.private[kid] = (alg, key)
        self.keys.append({**jwk, "kid": kid, "use": "sig", **jwk_extra})

    def remove(self, kid: str) -> None:
        self.keys = [k for k in self.keys if k.get("kid") != kid]

    def token(self, kid: str, header_kid: str | None = "same", **claims: Any) -> str:
        alg, key = self.private[kid]
        now = int(time.time())
        payload = {"sub": "user", "tenant": "acme", "iat": now, "exp": now + 300, **claims}
        headers = {} if header_kid is None else {"kid": kid if header_kid == "same" else header_kid}
        return jwt.encode(payload, key, algorithm=alg, headers=headers)

    async def handle(self, request: web.Request) -> web.Response:
        self.hits += 1
        if self.status != 200:
            return web.Response(status=self.status, text="unavailable")
        return web.json_response({"keys": self.keys})


@pytest.fixture
async def jwks_server(
    aiohttp_server: Callable[[web.Application], Awaitable[TestServer]],
) -> tuple[JwksServer, str]:
    state = JwksServer()
    app = web.Application()
    app.router.add_get("/jwks.json", state.handle)
    server = await aiohttp_server(app)
    return state, str(server.make_url("/jwks.json"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_verifier(
    jwks_server: tuple[JwksServer, str], clock: FakeClock
) -> AsyncIterator[Callable[[], Awaitable[TokenVerifier]]]:
    made: list[TokenVerifier] = []

    async def make() -> TokenVerifier:
        _, url = jwks_server
        settings = AuthSettings(hs256_secret_file="", jwks_url=url, jwks_cache_s=CACHE_S)
        v = TokenVerifier(settings, jwks_min_refresh_interval_s=MIN_INTERVAL_S, clock=clock)
        made.append(v)
        await v.start()
        return v

    yield make
    for v in made:
        await v.close()


async def reason_of(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(AuthError) as info:
        await verifier.verify(token)
    return info.value.reason


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
async def test_fetch_and_verify(jwks_server: Any, make_verifier: Any, alg: str) -> None:
    server, _ = jwks_server
    server.add("k1", alg)
    v = await make_verifier()
    principal = await v.verify(server.token("k1"))
    assert principal.tenant == "acme"
    # A token without a kid is tried against the JWKS keys of its algorithm.
    assert await v.verify(server.token("k1", header_kid=None))
    assert server.hits == 1


async def test_rotation_fetches_new_kid(jwks_server: Any, make_verifier: Any, clock: Any) -> None:
    server, _ = jwks_server
    server.add("k1")
    v = await make_verifier()
    server.add("k2", "ES256")
    clock.advance(MIN_INTERVAL_S)
    assert (await v.verify(server.token("k2"))).sub == "user"
    assert server.hits == 2
    assert await v.verify(server.token("k1"))
    assert server.hits == 2


async def test_unknown_kid_refresh_is_rate_limited(
    jwks_server: Any, make_verifier: Any, clock: Any
) -> None:
    server, _ = jwks_server
    server.add("k1")
    v = await make_verifier()
    clock.advance(MIN_INTERVAL_S)

    async def attempt() -> str:
        return await reason_of(v, server.token("k1", header_kid=secrets.token_hex(8)))

    # A concurrent flood shares one refresh...
    assert set(await asyncio.gather(*(attempt() for _ in range(50)))) == {"unknown_kid"}
    assert server.hits == 2
    # ...and more made-up kids within the interval cost the server nothing.
    for _ in range(20):
        assert await attempt() == "unknown_kid"
    assert server.hits == 2
    clock.advance(MIN_INTERVAL_S)
    assert await attempt() == "unknown_kid"
    assert server.hits == 3


async def test_rotated_key_waits_for_the_interval(
    jwks_server: Any, make_verifier: Any, clock: Any
) -> None:
    server, _ = jwks_server
    server.add("k1")
    v = await make_verifier()
    server.add("k2")
    assert await reason_of(v, server.token("k2")) == "unknown_kid"
    clock.advance(MIN_INTERVAL_S)
    assert await v.verify(server.token("k2"))


async def test_stale_keys_served_when_refresh_fails(
    jwks_server: Any, make_verifier: Any, clock: Any
) -> None:
    server, _ = jwks_server
    server.add("k1")
    v = await make_verifier()
    server.status = 503
    clock.advance(CACHE_S + 1)
    assert await v.verify(server.token("k1"))  # starts a background refresh
    assert v.jwks is not None
    await v.jwks.settled()
    assert server.hits == 2 and v.jwks.last_error == "ValueError: HTTP 503"
    assert await v.verify(server.token("k1"))
    assert server.hits == 2  # the failed refresh is not retried at once


async def test_expired_cache_drops_removed_key(
    jwks_server: Any, make_verifier: Any, clock: Any
) -> None:
    server, _ = jwks_server
    server.add("k1")
    server.add("k2")
    v = await make_verifier()
    server.remove("k1")
    clock.advance(CACHE_S + 1)
    assert await v.verify(server.token("k2"))
    assert v.jwks is not None
    await v.jwks.settled()
    assert await reason_of(v, server.token("k1")) == "unknown_kid"


async def test_unreachable_at_start_then_recovers(
    jwks_server: Any, make_verifier: Any, clock: Any
) -> None:
    server, _ = jwks_server
    server.add("k1")
    server.status = 500
    v = await make_verifier()  # does not raise: other keys may still work
    assert await reason_of(v, server.token("k1")) == "unknown_kid"
    server.status = 200
    clock.advance(MIN_INTERVAL_S)
    assert await v.verify(server.token("k1"))


async def test_hs256_token_naming_an_rsa_kid(jwks_server: Any, make_verifier: Any) -> None:
    server, _ = jwks_server
    server.add("k1")
    v = await make_verifier()
    pem_like = b"x" * 64
    now = int(time.time())
    token = jwt.encode(
        {"sub": "u", "tenant": "acme", "iat": now, "exp": now + 60},
        pem_like,
        algorithm="HS256",
        headers={"kid": "k1"},
    )
    assert await reason_of(v, token) == "alg_not_allowed"


async def test_unsafe_jwks_entries_are_skipped(
    jwks_server: Any, make_verifier: Any, clock: Any
) -> None:
    server, _ = jwks_server
    secret = secrets.token_bytes(32)
    server.keys.append(
        {"kty": "oct", "kid": "sym", "k": jwt.utils.base64url_encode(secret).decode()}
    )
    server.add("mislabelled")
    server.keys[-1]["alg"] = "RS512"
    server.add("encryption", use="enc")
    server.add("good", "EdDSA")
    v = await make_verifier()
    now = int(time.time())
    sym = jwt.encode(
        {"sub": "u", "tenant": "acme", "iat": now, "exp": now + 60},
        secret,
        algorithm="HS256",
        headers={"kid": "sym"},
    )
    assert await reason_of(v, sym) == "unknown_kid"
    assert await reason_of(v, server.token("mislabelled")) == "unknown_kid"
    assert await reason_of(v, server.token("encryption")) == "unknown_kid"
    assert await v.verify(server.token("good"))
