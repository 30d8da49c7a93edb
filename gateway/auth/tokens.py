"""Bearer JWT verification and development token minting.

A token is accepted only when a configured key pinned to the token's `alg`
verifies its signature (keys: `gateway.keys`; parsing and claim rules:
`gateway.auth.jws`; signatures: PyJWT's algorithm objects) and its claims hold:

* `exp`, `iat`, `sub` and the tenant claim (`auth.tenant_claim`) are required;
  `sub` and the tenant are non-empty, trimmed, printable strings (<= 256 chars);
* `exp` is in the future and `iat`/`nbf` are not, each within `auth.leeway_s`;
* `exp - iat` is at most `auth.max_token_ttl_s`;
* `iss` must equal `auth.issuer` when one is set;
* `aud` must contain `auth.audience` when one is set. When none is set, a token
  that carries an `aud` is refused: it was meant for somebody else (approval
  tokens, `aud: execgate:approval`, can never pass as bearer tokens).
* scopes come from `scope` (space-separated) and/or `scp` (list or string).

Key choice: a token naming a `kid` is checked with the JWKS keys of that `kid`
(the JWKS is fetched again, rate-limited, when the `kid` is unknown); failing
that, and for tokens without `kid`, with every key of the token's `alg` that has
no `kid` (the HS256 secret, PEM files) and, without `kid`, the JWKS keys too.

`AuthError.reason` is a short stable word for logs, metrics and audit records:
malformed, alg_not_allowed, unknown_kid, bad_signature, expired, not_yet_valid,
bad_audience, bad_issuer, ttl_too_long, missing_claim:<name>, bad_claim:<name>.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import jwt

from gateway.auth.jwks import JwksCache
from gateway.auth.jws import (
    AuthError,
    ClaimRules,
    check_claims,
    parse_compact,
    parse_payload,
    verify_signature,
)
from gateway.auth.keys import (
    ALLOWED_ALGORITHMS,
    KeyConfigError,
    VerificationKey,
    hs256_key,
    load_or_create_dev_secret,
    load_public_key_file,
)
from gateway.settings.model import AuthSettings, SettingsError

__all__ = ["AuthError", "Principal", "TokenVerifier", "load_or_create_dev_secret", "mint_token"]

MAX_TOKEN_BYTES = 16 * 1024
MAX_IDENTITY_CHARS = 256


@dataclass(frozen=True)
class Principal:
    sub: str
    tenant: str
    scopes: frozenset[str]
    claims: dict[str, Any]  # the verified payload; the token itself is never kept


class TokenVerifier:
    def __init__(
        self,
        settings: AuthSettings,
        *,
        session: aiohttp.ClientSession | None = None,
        jwks_min_refresh_interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._session = session
        self._own_session = False
        self._jwks_min_interval_s = (
            settings.jwks_min_refresh_s
            if jwks_min_refresh_interval_s is None
            else jwks_min_refresh_interval_s
        )
        self._clock = clock  # for the JWKS cache's ages; token times use the wall clock
        self._local: list[VerificationKey] = []
        self.jwks: JwksCache | None = None
        self._rules = ClaimRules(
            required=("exp", "iat", "sub", settings.tenant_claim),
            issuer=settings.issuer,
            audience=settings.audience,
            leeway_s=settings.leeway_s,
            max_ttl_s=settings.max_token_ttl_s,
        )

    async def start(self) -> None:
        """Load every configured key; a missing or unusable key is a SettingsError."""
        self._local = await asyncio.to_thread(self._load_local_keys)
        if self.settings.jwks_url:
            if self._session is None:
                self._session = aiohttp.ClientSession()
                self._own_session = True
            self.jwks = JwksCache(
                self.settings.jwks_url,
                self._session,
                cache_s=self.settings.jwks_cache_s,
                min_refresh_interval_s=self._jwks_min_interval_s,
                clock=self._clock,
            )
            await self.jwks.start()
        if not self._local and self.jwks is None:
            raise SettingsError("auth: no verification key configured")

    def _load_local_keys(self) -> list[VerificationKey]:
        keys = []
        secret_file = self.settings.hs256_secret_file
        if secret_file:
            try:
                keys.append(hs256_key(load_or_create_dev_secret(secret_file), secret_file))
            except (KeyConfigError, OSError) as exc:
                raise SettingsError(f"auth.hs256_secret_file: {exc}") from None
        for index, path in enumerate(self.settings.public_keys):
            try:
                keys.append(load_public_key_file(path))
            except KeyConfigError as exc:
                raise SettingsError(f"auth.public_keys[{index}]: {exc}") from None
        return keys

    async def close(self) -> None:
        if self.jwks is not None:
            await self.jwks.close()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # --- the hot path: no file reads, keys parsed at start ----------------------------

    async def verify(self, token: str) -> Principal:
        """The principal a valid token stands for; AuthError otherwise."""
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_BYTES:
            raise AuthError("malformed", "empty or oversized token")
        compact = parse_compact(token)
        alg = compact.header.get("alg")
        if alg not in ALLOWED_ALGORITHMS:
            raise AuthError("alg_not_allowed", f"alg {alg!r}")
        candidates = await self._candidates(alg, compact.header.get("kid"))
        # Each key verifies with its own pinned algorithm, never the header's choice.
        if not any(verify_signature(compact, key.alg, key.key) for key in candidates):
            raise AuthError("bad_signature")
        claims = parse_payload(compact)
        check_claims(claims, self._rules, time.time())
        return Principal(
            sub=_identity(claims, "sub"),
            tenant=_identity(claims, self.settings.tenant_claim),
            scopes=_scopes(claims),
            claims=claims,
        )

    async def _candidates(self, alg: str, kid: str | None) -> list[VerificationKey]:
        jwks = self.jwks
        if jwks is not None:
            jwks.refresh_if_stale()
            if kid is not None:
                named = jwks.with_kid(kid)
                if not named and alg != "HS256":  # a JWKS never supplies HS256 keys
                    await jwks.refresh_for_unknown_kid()
                    named = jwks.with_kid(kid)
                if named:
                    pinned = [k for k in named if k.alg == alg]
                    if not pinned:
                        raise AuthError("alg_not_allowed", f"kid {kid!r} is not an {alg} key")
                    return pinned
        candidates = [k for k in self._local if k.alg == alg]
        if kid is None and jwks is not None:
            candidates += jwks.for_alg(alg)
        if not candidates:
            if kid is not None and jwks is not None:
                raise AuthError("unknown_kid", f"kid {kid!r}")
            raise AuthError("alg_not_allowed", f"no {alg} key configured")
        return candidates


def _identity(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    if (
        not isinstance(value, str)
        or not value
        or value != value.strip()
        or len(value) > MAX_IDENTITY_CHARS
        or not value.isprintable()
    ):
        raise AuthError(f"bad_claim:{name}", "must be a non-empty, trimmed, printable string")
    return value


def _scopes(claims: dict[str, Any]) -> frozenset[str]:
    scopes: set[str] = set()
    for name in ("scope", "scp"):
        value = claims.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            scopes.update(value.split())
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            scopes.update(v for v in value if v)
        else:
            raise AuthError(f"bad_claim:{name}", "must be a string or a list of strings")
    return frozenset(scopes)


def mint_token(
    secret: bytes,
    *,
    tenant: str,
    sub: str,
    scopes: Iterable[str] | str,
    ttl_s: int,
    tenant_claim: str = "tenant",
    issuer: str = "",
    audience: str = "",
    extra_claims: dict[str, Any] | None = None,
) -> str:
    """An HS256 token for development (`execgate token`), signed with `secret`."""
    if ttl_s <= 0:
        raise ValueError("ttl_s must be positive")
    if isinstance(scopes, str):
        scopes = scopes.split()
    now = int(time.time())
    payload: dict[str, Any] = dict(extra_claims or {})
    payload.update(
        {
            "sub": sub,
            tenant_claim: tenant,
            "scope": " ".join(dict.fromkeys(scopes)),
            "iat": now,
            "exp": now + int(ttl_s),
            "jti": secrets.token_urlsafe(12),
        }
    )
    if issuer:
        payload["iss"] = issuer
    if audience:
        payload["aud"] = audience
    return jwt.encode(payload, secret, algorithm="HS256")
