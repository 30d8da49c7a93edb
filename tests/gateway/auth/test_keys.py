"""Key loading: the development secret and PEM files, and start-up errors naming the key."""

from __future__ import annotations

import logging
import stat
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from gateway.auth.keys import KeyConfigError, load_or_create_dev_secret
from gateway.auth.tokens import AuthError, TokenVerifier, mint_token
from gateway.settings.model import AuthSettings, SettingsError


def public_pem(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def test_dev_secret_created_private_and_reused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "var" / "keys" / "dev-hs256.key"
    with caplog.at_level(logging.INFO):
        secret = load_or_create_dev_secret(path)
    assert len(secret) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "var").stat().st_mode) == 0o700
    assert list(path.parent.iterdir()) == [path]  # no temp file left behind
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "DEVELOPMENT" in message and "NOT FOR PRODUCTION" in message
    assert secret.decode() not in caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert load_or_create_dev_secret(path) == secret
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_verifier_generates_dev_key_on_first_start(tmp_path: Path) -> None:
    path = tmp_path / "var" / "dev-hs256.key"
    first = TokenVerifier(AuthSettings(hs256_secret_file=str(path)))
    await first.start()
    await first.close()
    secret = path.read_bytes().rstrip(b"\n")

    second = TokenVerifier(AuthSettings(hs256_secret_file=str(path)))
    await second.start()
    token = mint_token(secret, tenant="acme", sub="dev", scopes=["exec:python"], ttl_s=60)
    principal = await second.verify(token)
    await second.close()
    assert path.read_bytes().rstrip(b"\n") == secret
    assert principal.scopes == {"exec:python"}


def test_short_operator_secret_refused(tmp_path: Path) -> None:
    path = tmp_path / "short.key"
    path.write_bytes(b"too-short\n")
    with pytest.raises(KeyConfigError, match="shorter than 32"):
        load_or_create_dev_secret(path)
    assert path.read_bytes() == b"too-short\n"  # refused, not replaced


@pytest.mark.parametrize(
    ("content", "secret"),
    [
        (b"k" * 40, b"k" * 40),
        (b"k" * 40 + b"\n", b"k" * 40),
        (b"k" * 40 + b"\r\n", b"k" * 40),
        # Only the one line ending goes: the bytes before it are the operator's.
        (b"k" * 40 + b"\r", b"k" * 40 + b"\r"),
        (b"k" * 40 + b"\n\n", b"k" * 40 + b"\n"),
        (b"k" * 40 + b" \n", b"k" * 40 + b" "),
        (b"\nk" + b"k" * 39 + b"\n", b"\nk" + b"k" * 39),
    ],
)
def test_operator_secret_loses_only_its_line_ending(
    tmp_path: Path, content: bytes, secret: bytes
) -> None:
    path = tmp_path / "hs256.key"
    path.write_bytes(content)
    assert load_or_create_dev_secret(path) == secret


def test_secret_of_32_bytes_counted_without_its_line_ending(tmp_path: Path) -> None:
    # A 32-byte secret that ends in 0x0d is 32 bytes, not 31 (the line ending is only "\r\n").
    path = tmp_path / "hs256.key"
    path.write_bytes(b"k" * 31 + b"\r")
    assert load_or_create_dev_secret(path) == b"k" * 31 + b"\r"
    path.write_bytes(b"k" * 31 + b"\r\n")
    with pytest.raises(KeyConfigError, match="shorter than 32"):
        load_or_create_dev_secret(path)


async def test_hs256_can_be_disabled(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "es.pem"
    pem.write_bytes(public_pem(key))
    v = TokenVerifier(AuthSettings(hs256_secret_file="", public_keys=[str(pem)]))
    await v.start()
    now = int(time.time())
    claims = {"sub": "a", "tenant": "t", "iat": now, "exp": now + 60}
    assert await v.verify(jwt.encode(claims, key, algorithm="ES256"))
    with pytest.raises(AuthError) as info:
        await v.verify(jwt.encode(claims, b"k" * 40, algorithm="HS256"))
    assert info.value.reason == "alg_not_allowed"
    await v.close()


async def test_certificate_file_accepted(tmp_path: Path) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "idp")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = tmp_path / "idp.crt"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    v = TokenVerifier(AuthSettings(hs256_secret_file="", public_keys=[str(pem)]))
    await v.start()
    t = int(time.time())
    token = jwt.encode({"sub": "a", "tenant": "t", "iat": t, "exp": t + 60}, key, "RS256")
    assert (await v.verify(token)).tenant == "t"
    await v.close()


def _private_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "not found"),
        (b"hello", "not a PEM"),
        (
            lambda: _private_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            "private key",
        ),
        (
            lambda: public_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)),
            "1024 bits",
        ),
        (lambda: public_pem(ec.generate_private_key(ec.SECP384R1())), "secp384r1"),
    ],
    ids=["missing", "garbage", "private", "rsa-1024", "p-384"],
)
async def test_unusable_public_key_is_a_start_error(
    tmp_path: Path, content: object, match: str
) -> None:
    pem = tmp_path / "key.pem"
    if content is not None:
        pem.write_bytes(content() if callable(content) else content)  # type: ignore[arg-type]
    v = TokenVerifier(AuthSettings(hs256_secret_file="", public_keys=[str(pem)]))
    with pytest.raises(SettingsError, match=r"auth\.public_keys\[0\]") as info:
        await v.start()
    assert match in str(info.value)


async def test_no_key_at_all_is_a_start_error() -> None:
    v = TokenVerifier(AuthSettings(hs256_secret_file="", public_keys=[]))
    with pytest.raises(SettingsError, match="no verification key"):
        await v.start()
