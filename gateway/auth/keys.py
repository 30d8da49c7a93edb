"""Verification keys: the HS256 development secret, PEM public keys, JWKS entries.

Every key is pinned to exactly one algorithm, decided by the key's type and
never by a token: the HS256 secret verifies only HS256, RSA keys only RS256,
P-256 keys only ES256, Ed25519 keys only EdDSA. That is what makes HS/RS key
confusion and `alg: none` impossible, whatever a token's header says.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import HMACAlgorithm

from gateway.files import create_private_file

log = logging.getLogger(__name__)

ALLOWED_ALGORITHMS = frozenset({"HS256", "RS256", "ES256", "EdDSA"})
MIN_SECRET_BYTES = 32
MIN_RSA_BITS = 2048


class KeyConfigError(Exception):
    """A configured key is missing or unusable; the message names the file or key."""


@dataclass(frozen=True, slots=True)
class VerificationKey:
    alg: str  # the one algorithm this key verifies
    key: Any  # bytes (HS256) or a cryptography public key object, parsed once
    kid: str | None  # None: tried for any token of this alg whose kid is unknown
    source: str  # where it came from, for logs (never the key itself)


# --- HS256 development secret ---------------------------------------------------


def load_or_create_dev_secret(path: str | os.PathLike[str]) -> bytes:
    """The HS256 secret in `path`, generated (0600, in a 0700 directory) if missing.

    The secret is the file's content without one final line ending ("\n" or "\r\n"),
    so a file written by `echo`, `openssl rand -base64` or an editor works, and every
    other byte is kept (whitespace inside or before the line ending is key material;
    a secret is a line of text, as `openssl rand -base64 48` writes). Blocking: call it
    in a thread.
    """
    path = Path(path)
    try:
        return _read_secret(path)
    except FileNotFoundError:
        pass
    created = create_private_file(path, secrets.token_urlsafe(48).encode("ascii") + b"\n")
    if created:
        log.warning(
            "*** DEVELOPMENT SIGNING KEY GENERATED at %s *** Anyone who can read this file "
            "can mint tokens for any tenant. It is for development only, NOT FOR PRODUCTION: "
            'configure auth.public_keys or auth.jwks_url and set auth.hs256_secret_file = "".',
            path,
        )
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    secret = strip_line_ending(path.read_bytes())
    if len(secret) < MIN_SECRET_BYTES:
        raise KeyConfigError(f"{path}: HS256 secret is shorter than {MIN_SECRET_BYTES} bytes")
    mode = path.stat().st_mode & 0o077
    if mode:
        log.warning("HS256 secret %s is readable by group or others (mode %o)", path, mode)
    return secret


def strip_line_ending(content: bytes) -> bytes:
    """`content` without one final "\n" or "\r\n": only the line ending, never key bytes."""
    if content.endswith(b"\r\n"):
        return content[:-2]
    if content.endswith(b"\n"):
        return content[:-1]
    return content


def hs256_key(secret: bytes, source: str) -> VerificationKey:
    """The secret, checked once (PyJWT refuses PEM/SSH/DER-looking HMAC secrets)."""
    try:
        prepared = HMACAlgorithm(HMACAlgorithm.SHA256).prepare_key(secret)
    except jwt.InvalidKeyError as exc:
        raise KeyConfigError(f"{source}: {exc}") from None
    return VerificationKey("HS256", prepared, None, source)


# --- asymmetric public keys ------------------------------------------------------


def algorithm_for(public_key: Any) -> str:
    """The single algorithm a public key is pinned to; KeyConfigError for unsupported keys."""
    if isinstance(public_key, rsa.RSAPublicKey):
        if public_key.key_size < MIN_RSA_BITS:
            raise KeyConfigError(f"RSA key of {public_key.key_size} bits (need {MIN_RSA_BITS}+)")
        return "RS256"
    if isinstance(public_key, ec.EllipticCurvePublicKey):
        if not isinstance(public_key.curve, ec.SECP256R1):
            raise KeyConfigError(f"EC key on curve {public_key.curve.name} (only P-256/ES256)")
        return "ES256"
    if isinstance(public_key, ed25519.Ed25519PublicKey):
        return "EdDSA"
    raise KeyConfigError(f"unsupported key type {type(public_key).__name__}")


def load_public_key_file(path: str | os.PathLike[str]) -> VerificationKey:
    """A PEM public key (or certificate) file; blocking, call it in a thread."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KeyConfigError(f"public key file not found: {path}") from None
    except OSError as exc:
        raise KeyConfigError(f"public key file unreadable: {path}: {exc.strerror}") from None
    if b"PRIVATE KEY-----" in data:
        raise KeyConfigError(f"{path} holds a private key: configure the public key only")
    try:
        if b"-----BEGIN CERTIFICATE-----" in data:
            public_key: Any = x509.load_pem_x509_certificate(data).public_key()
        else:
            public_key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise KeyConfigError(f"{path}: not a PEM public key or certificate: {exc}") from None
    try:
        alg = algorithm_for(public_key)
    except KeyConfigError as exc:
        raise KeyConfigError(f"{path}: {exc}") from None
    return VerificationKey(alg, public_key, None, str(path))


# --- JWKS -------------------------------------------------------------------------


def keys_from_jwks(document: Any, source: str, *, max_keys: int = 64) -> list[VerificationKey]:
    """Usable signature keys of a JWKS document; unusable entries are skipped and logged.

    Symmetric (`oct`) keys are never taken from a JWKS, and a key whose `alg`
    differs from the one its type is pinned to is skipped.
    """
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise KeyConfigError(f"{source}: not a JWKS document (no 'keys' list)")
    out: list[VerificationKey] = []
    for index, entry in enumerate(document["keys"][:max_keys]):
        try:
            out.append(_jwk_entry(entry))
        except KeyConfigError as exc:
            log.warning("%s: key %d skipped: %s", source, index, exc)
    return out


def _jwk_entry(entry: Any) -> VerificationKey:
    if not isinstance(entry, dict):
        raise KeyConfigError("not an object")
    kid = entry.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise KeyConfigError("kid is not a string")
    if entry.get("kty") == "oct":
        raise KeyConfigError(f"kid {kid!r}: symmetric keys are not accepted from a JWKS")
    if entry.get("use", "sig") != "sig":
        raise KeyConfigError(f"kid {kid!r}: use is {entry.get('use')!r}, not 'sig'")
    public = {k: v for k, v in entry.items() if k not in ("d", "p", "q", "dp", "dq", "qi")}
    try:
        parsed = jwt.PyJWK(public, algorithm=_pinned_for_jwk(public))
        alg = algorithm_for(parsed.key)
    except (jwt.PyJWKError, jwt.InvalidKeyError, KeyConfigError, ValueError, TypeError) as exc:
        raise KeyConfigError(f"kid {kid!r}: {exc}") from None
    declared = entry.get("alg")
    if declared is not None and declared != alg:
        raise KeyConfigError(f"kid {kid!r}: alg {declared!r} is not allowed for this key type")
    return VerificationKey(alg, parsed.key, kid, f"jwks kid={kid}")


def _pinned_for_jwk(entry: dict[str, Any]) -> str:
    kty, crv = entry.get("kty"), entry.get("crv")
    if kty == "RSA":
        return "RS256"
    if kty == "EC" and crv == "P-256":
        return "ES256"
    if kty == "OKP" and crv == "Ed25519":
        return "EdDSA"
    raise KeyConfigError(f"unsupported key type kty={kty!r} crv={crv!r}")
