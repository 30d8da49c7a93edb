"""TokenVerifier against real tokens: every algorithm, every refusal reason."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from gateway.auth.tokens import AuthError, Principal, TokenVerifier, mint_token
from gateway.settings.model import AuthSettings

SECRET = b"s" * 48


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {
        "sub": "svc:agent-7",
        "tenant": "acme",
        "scope": "exec:python exec:bash",
        "iat": now,
        "exp": now + 600,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def hs256(payload: dict[str, Any], secret: bytes = SECRET, **headers: Any) -> str:
    return jwt.encode(payload, secret, algorithm="HS256", headers=headers or None)


def hand_made(header: dict[str, Any], payload: Any, signature: bytes = b"") -> str:
    head = b64url(json.dumps(header).encode())
    body = b64url(payload if isinstance(payload, bytes) else json.dumps(payload).encode())
    return f"{head}.{body}.{b64url(signature)}"


class Keys:
    """One private key per asymmetric algorithm, public halves as PEM files."""

    def __init__(self, directory: Path) -> None:
        self.private = {
            "RS256": rsa.generate_private_key(public_exponent=65537, key_size=2048),
            "ES256": ec.generate_private_key(ec.SECP256R1()),
            "EdDSA": ed25519.Ed25519PrivateKey.generate(),
        }
        self.pem_files: dict[str, Path] = {}
        for alg in self.private:
            path = directory / f"{alg.lower()}.pem"
            path.write_bytes(self.public_pem(alg))
            self.pem_files[alg] = path

    def public_pem(self, alg: str) -> bytes:
        return (
            self.private[alg]
            .public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def sign(self, alg: str, payload: dict[str, Any], **headers: Any) -> str:
        return jwt.encode(payload, self.private[alg], algorithm=alg, headers=headers or None)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    return Keys(tmp_path_factory.mktemp("keys"))


def settings_for(tmp_path: Path, keys: Keys | None = None, **overrides: Any) -> AuthSettings:
    secret_file = tmp_path / "hs256.key"
    if not secret_file.exists():
        secret_file.write_bytes(SECRET + b"\n")
        secret_file.chmod(0o600)
    values: dict[str, Any] = {"hs256_secret_file": str(secret_file)}
    if keys is not None:
        values["public_keys"] = [str(p) for p in keys.pem_files.values()]
    values.update(overrides)
    return AuthSettings(**values)


@pytest.fixture
async def verifier(tmp_path: Path, keys: Keys) -> AsyncIterator[TokenVerifier]:
    v = TokenVerifier(settings_for(tmp_path, keys))
    await v.start()
    yield v
    await v.close()


async def reason_of(verifier: TokenVerifier, token: str) -> str:
    with pytest.raises(AuthError) as info:
        await verifier.verify(token)
    return info.value.reason


async def test_valid_hs256(verifier: TokenVerifier) -> None:
    principal = await verifier.verify(hs256(claims()))
    assert principal == Principal(
        sub="svc:agent-7",
        tenant="acme",
        scopes=frozenset({"exec:python", "exec:bash"}),
        claims=principal.claims,
    )
    assert principal.claims["tenant"] == "acme" and principal.claims["sub"] == "svc:agent-7"


@pytest.mark.parametrize("alg", ["RS256", "ES256", "EdDSA"])
async def test_valid_asymmetric(verifier: TokenVerifier, keys: Keys, alg: str) -> None:
    principal = await verifier.verify(keys.sign(alg, claims(sub=f"user-{alg}")))
    assert principal.sub == f"user-{alg}" and principal.tenant == "acme"


async def test_expired(verifier: TokenVerifier) -> None:
    now = int(time.time())
    token = hs256(claims(iat=now - 3600, exp=now - 120))
    assert await reason_of(verifier, token) == "expired"


async def test_expiry_within_leeway_is_accepted(verifier: TokenVerifier) -> None:
    now = int(time.time())
    assert await verifier.verify(hs256(claims(iat=now - 600, exp=now - 5)))


@pytest.mark.parametrize("field", ["iat", "nbf"])
async def test_not_yet_valid(verifier: TokenVerifier, field: str) -> None:
    now = int(time.time())
    token = hs256(claims(**{field: now + 600}, exp=now + 1200))
    assert await reason_of(verifier, token) == "not_yet_valid"


async def test_wrong_signature(verifier: TokenVerifier) -> None:
    assert await reason_of(verifier, hs256(claims(), secret=b"x" * 48)) == "bad_signature"
    head, _, sig = hs256(claims()).split(".")
    forged = b64url(json.dumps(claims(tenant="other")).encode())
    assert await reason_of(verifier, f"{head}.{forged}.{sig}") == "bad_signature"


async def test_wrong_asymmetric_key(verifier: TokenVerifier) -> None:
    stranger = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode(claims(), stranger, algorithm="ES256")
    assert await reason_of(verifier, token) == "bad_signature"


async def test_audience(tmp_path: Path) -> None:
    v = TokenVerifier(settings_for(tmp_path, audience="execgate"))
    await v.start()
    assert await v.verify(hs256(claims(aud="execgate")))
    assert await v.verify(hs256(claims(aud=["other", "execgate"])))
    assert await reason_of(v, hs256(claims(aud="other"))) == "bad_audience"
    assert await reason_of(v, hs256(claims())) == "missing_claim:aud"
    await v.close()


async def test_token_with_audience_refused_when_none_configured(verifier: TokenVerifier) -> None:
    token = hs256(claims(aud="execgate:approval"))
    assert await reason_of(verifier, token) == "bad_audience"


async def test_issuer(tmp_path: Path) -> None:
    v = TokenVerifier(settings_for(tmp_path, issuer="https://idp.example"))
    await v.start()
    assert await v.verify(hs256(claims(iss="https://idp.example")))
    assert await reason_of(v, hs256(claims(iss="https://evil.example"))) == "bad_issuer"
    assert await reason_of(v, hs256(claims())) == "missing_claim:iss"
    await v.close()


@pytest.mark.parametrize("alg", ["none", "None", "NONE", "", None, "HS512", "RS384", "PS256"])
async def test_algorithm_not_allowed(verifier: TokenVerifier, alg: str | None) -> None:
    header = {"typ": "JWT"} if alg is None else {"alg": alg, "typ": "JWT"}
    token = hand_made(header, claims())
    assert await reason_of(verifier, token) == "alg_not_allowed"


async def test_alg_none_with_hmac_signature_still_refused(verifier: TokenVerifier) -> None:
    unsigned = hand_made({"alg": "none"}, claims())
    signing_input = unsigned.rsplit(".", 1)[0].encode()
    signed = unsigned + b64url(hmac.new(SECRET, signing_input, hashlib.sha256).digest())
    assert await reason_of(verifier, signed) == "alg_not_allowed"


async def test_hs_rs_key_confusion(verifier: TokenVerifier, keys: Keys) -> None:
    """An HS256 token whose 'secret' is the RSA public key PEM never verifies."""
    pem = keys.public_pem("RS256")
    unsigned = hand_made({"alg": "HS256", "typ": "JWT"}, claims())
    signing_input = unsigned.rsplit(".", 1)[0].encode()
    token = unsigned + b64url(hmac.new(pem, signing_input, hashlib.sha256).digest())
    assert await reason_of(verifier, token) == "bad_signature"


async def test_algorithm_without_a_key(tmp_path: Path, keys: Keys) -> None:
    v = TokenVerifier(settings_for(tmp_path))  # HS256 only
    await v.start()
    assert await reason_of(v, keys.sign("RS256", claims())) == "alg_not_allowed"
    await v.close()


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"tenant": None}, "missing_claim:tenant"),
        ({"tenant": ""}, "bad_claim:tenant"),
        ({"tenant": " acme"}, "bad_claim:tenant"),
        ({"tenant": "ac\nme"}, "bad_claim:tenant"),
        ({"tenant": 42}, "bad_claim:tenant"),
        ({"tenant": "t" * 300}, "bad_claim:tenant"),
        ({"sub": None}, "missing_claim:sub"),
        ({"sub": ""}, "bad_claim:sub"),
        ({"sub": 7}, "bad_claim:sub"),
        ({"exp": None}, "missing_claim:exp"),
        ({"iat": None}, "missing_claim:iat"),
        ({"iat": "yesterday"}, "bad_claim:iat"),
        ({"scope": 5}, "bad_claim:scope"),
        ({"scp": ["exec:python", 5]}, "bad_claim:scp"),
    ],
)
async def test_bad_claims(verifier: TokenVerifier, overrides: dict[str, Any], reason: str) -> None:
    assert await reason_of(verifier, hs256(claims(**overrides))) == reason


async def test_tenant_claim_name_is_configurable(tmp_path: Path) -> None:
    v = TokenVerifier(settings_for(tmp_path, tenant_claim="https://example.com/org"))
    await v.start()
    principal = await v.verify(hs256(claims(tenant=None, **{"https://example.com/org": "acme"})))
    assert principal.tenant == "acme"
    assert await reason_of(v, hs256(claims())) == "missing_claim:https://example.com/org"
    await v.close()


@pytest.mark.parametrize(
    "token",
    [
        "",
        "garbage",
        "two.segments",
        "a.b.c.d",
        "###.###.###",
        "x" * 20000,
        b64url(b"not json") + "." + b64url(b"{}") + ".",
        b64url(b"[1, 2]") + "." + b64url(b"{}") + ".",
        hand_made({"alg": "HS256", "kid": 5}, claims()),
        hand_made({"alg": "HS256", "crit": ["exp"]}, claims()),
        hand_made({"alg": "HS256", "b64": False}, claims()),
        hs256(claims()) + "=",
        hs256(claims()).replace(".", "=.", 1),
        "caf\u00e9.b.c",
    ],
    ids=lambda t: t[:20] or "empty",
)
async def test_malformed(verifier: TokenVerifier, token: str) -> None:
    assert await reason_of(verifier, token) == "malformed"


async def test_signed_non_json_payload_is_malformed(verifier: TokenVerifier) -> None:
    unsigned = hand_made({"alg": "HS256"}, b"not json")
    signing_input = unsigned.rsplit(".", 1)[0].encode()
    token = unsigned + b64url(hmac.new(SECRET, signing_input, hashlib.sha256).digest())
    assert await reason_of(verifier, token) == "malformed"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"scope": "a b  c"}, {"a", "b", "c"}),
        ({"scope": None, "scp": ["a", "b"]}, {"a", "b"}),
        ({"scope": None, "scp": "a b"}, {"a", "b"}),
        ({"scope": "a", "scp": ["b"]}, {"a", "b"}),
        ({"scope": None}, set()),
    ],
)
async def test_scopes(verifier: TokenVerifier, extra: dict[str, Any], expected: set[str]) -> None:
    principal = await verifier.verify(hs256(claims(**extra)))
    assert principal.scopes == frozenset(expected)


async def test_over_long_ttl(tmp_path: Path) -> None:
    v = TokenVerifier(settings_for(tmp_path, max_token_ttl_s=3600))
    await v.start()
    now = int(time.time())
    assert await v.verify(hs256(claims(iat=now, exp=now + 3600)))
    assert await reason_of(v, hs256(claims(iat=now, exp=now + 3601))) == "ttl_too_long"
    await v.close()


async def test_keys_are_read_once(tmp_path: Path, keys: Keys) -> None:
    settings = settings_for(tmp_path, keys)
    v = TokenVerifier(settings)
    await v.start()
    os.unlink(settings.hs256_secret_file)
    assert await v.verify(hs256(claims()))
    assert await v.verify(keys.sign("ES256", claims()))
    await v.close()


async def test_minted_token_round_trip(tmp_path: Path) -> None:
    settings = settings_for(
        tmp_path, tenant_claim="org", issuer="execgate-dev", audience="execgate"
    )
    v = TokenVerifier(settings)
    await v.start()
    token = mint_token(
        SECRET,
        tenant="acme",
        sub="dev",
        scopes="exec:python exec:bash",
        ttl_s=3600,
        tenant_claim="org",
        issuer="execgate-dev",
        audience="execgate",
        extra_claims={"team": "blue"},
    )
    principal = await v.verify(token)
    await v.close()
    assert principal.tenant == "acme" and principal.sub == "dev"
    assert principal.scopes == {"exec:python", "exec:bash"}
    assert principal.claims["team"] == "blue" and principal.claims["jti"]
    assert principal.claims["exp"] - principal.claims["iat"] == 3600
    assert token not in json.dumps(principal.claims)


async def test_non_canonical_base64_is_refused(verifier: TokenVerifier) -> None:
    """Flipping unused low bits of the last signature character decodes to the same bytes."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    token = hs256(claims())
    assert len(token.rsplit(".", 1)[1]) % 4 == 3  # 32 bytes: 2 spare bits at the end
    twin = token[:-1] + alphabet[alphabet.index(token[-1]) ^ 1]
    assert base64.urlsafe_b64decode(twin.rsplit(".", 1)[1] + "=") == base64.urlsafe_b64decode(
        token.rsplit(".", 1)[1] + "="
    )
    assert await verifier.verify(token)
    assert await reason_of(verifier, twin) == "malformed"
