"""Approval tokens: EdDSA JWTs (`aud: execgate:approval`) bound to what was approved.

Signed with the gateway's own Ed25519 key, separate from every bearer-token key, and
verified with that key and algorithm only, so neither `alg: none` nor HS/EdDSA key
confusion can forge one. A token binds the whole approved request (`binding`: the
digest of gateway/approvals/binding.py over language, code, files, stdin, backend,
tool, limits, egress, requester and tenant), an expiry and a single-use `jti`; the
SPEC's own claims (`tenant`, `code_sha256`, `limits`, `egress`) stay for readers.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from gateway.files import create_private_file

log = logging.getLogger(__name__)

AUDIENCE = "execgate:approval"
ISSUER = "execgate"
_REQUIRED = [
    "exp", "iat", "jti", "aud", "iss", "sub", "tenant", "code_sha256", "approval_id", "binding",
]  # fmt: skip


class ApprovalTokenError(Exception):
    """The approval token is not acceptable; `reason` is a stable short word."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ApprovalGrant:
    """A verified approval token's claims."""

    approval_id: str
    tenant: str
    requester: str
    approver: str
    code_sha256: str
    limits: dict[str, float]
    egress: tuple[str, ...]
    jti: str
    expires_at: float
    # The approved request's binding claim, compared whole at redemption.
    binding: dict[str, Any]


def load_or_create_signing_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """Blocking: call in a thread."""
    if not path.exists():
        key = ed25519.Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        if create_private_file(path, pem):
            log.warning("approval signing key generated at %s (Ed25519, mode 0600)", path)
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, ed25519.Ed25519PrivateKey):
        raise ValueError(f"approvals.signing_key_file {path}: not an Ed25519 private key")
    return loaded


class ApprovalSigner:
    def __init__(self, key: ed25519.Ed25519PrivateKey, clock: Any = time.time) -> None:
        self._key = key
        self._public = key.public_key()
        self._clock = clock

    def mint(
        self,
        *,
        approval_id: str,
        tenant: str,
        requester: str,
        approver: str,
        code_sha256: str,
        limits: dict[str, float],
        egress: list[str],
        binding: dict[str, Any],
        ttl_s: float,
    ) -> tuple[str, ApprovalGrant]:
        now = int(self._clock())
        jti = secrets.token_hex(16)
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "sub": requester,
            "tenant": tenant,
            "approval_id": approval_id,
            "approver": approver,
            "code_sha256": code_sha256,
            "limits": limits,
            "egress": egress,
            "binding": binding,
            "iat": now,
            "exp": now + max(int(ttl_s), 1),
            "jti": jti,
        }
        token = jwt.encode(claims, self._key, algorithm="EdDSA")
        return token, self._grant(claims)

    def verify(self, token: str) -> ApprovalGrant:
        try:
            claims = jwt.decode(
                token,
                self._public,
                algorithms=["EdDSA"],
                audience=AUDIENCE,
                issuer=ISSUER,
                options={"require": _REQUIRED},
            )
        except jwt.ExpiredSignatureError:
            raise ApprovalTokenError("expired") from None
        except jwt.InvalidAudienceError:
            raise ApprovalTokenError("bad_audience") from None
        except jwt.InvalidAlgorithmError:
            raise ApprovalTokenError("alg_not_allowed") from None
        except jwt.InvalidSignatureError:
            raise ApprovalTokenError("bad_signature") from None
        except jwt.InvalidTokenError as exc:
            raise ApprovalTokenError("malformed", type(exc).__name__) from None
        try:
            return self._grant(claims)
        except (KeyError, TypeError, ValueError) as exc:
            raise ApprovalTokenError("malformed", str(exc)) from None

    @staticmethod
    def _grant(claims: dict[str, Any]) -> ApprovalGrant:
        limits = claims.get("limits") or {}
        egress = claims.get("egress") or []
        binding = claims["binding"]
        if not isinstance(limits, dict) or not isinstance(egress, list):
            raise ValueError("limits and egress must be an object and a list")
        if not isinstance(binding, dict):
            raise ValueError("binding must be an object")
        return ApprovalGrant(
            approval_id=str(claims["approval_id"]),
            tenant=str(claims["tenant"]),
            requester=str(claims["sub"]),
            approver=str(claims.get("approver", "")),
            code_sha256=str(claims["code_sha256"]),
            limits={str(k): float(v) for k, v in limits.items()},
            egress=tuple(str(e) for e in egress),
            jti=str(claims["jti"]),
            expires_at=float(claims["exp"]),
            binding=binding,
        )
