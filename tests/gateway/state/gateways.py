"""Gateways for the state tests: the noop backend (no root), state in a real Redis."""

from __future__ import annotations

from pathlib import Path

from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token

REPO = Path(__file__).resolve().parents[3]


def gateway_env(root: Path, redis_url: str, **extra: str) -> dict[str, str]:
    """EXECGATE_* settings for a gateway whose files live in `root` (replicas share it)."""
    return {
        "EXECGATE_AUDIT_PATH": str(root / "audit.jsonl"),
        "EXECGATE_STATE_PATH": str(root / "state.db"),
        "EXECGATE_STATE_BACKEND": "redis",
        "EXECGATE_STATE_REDIS_URL": redis_url,
        "EXECGATE_AUTH_HS256_SECRET_FILE": str(root / "hs256.key"),
        "EXECGATE_APPROVALS_SIGNING_KEY_FILE": str(root / "approval-ed25519.pem"),
        "EXECGATE_POLICY_PATH": str(REPO / "policies"),
        "EXECGATE_POLICY_RELOAD_INTERVAL_S": "0",
        # A shared, busy test machine: a decision late is not what these tests test.
        "EXECGATE_POLICY_TIMEOUT_MS": "5000",
        "EXECGATE_BACKENDS_DEFAULT": "noop",
        **extra,
    }


def token(
    root: Path, tenant: str = "acme", scopes: str = "exec:python exec:bash", sub: str = "agent-7"
) -> str:
    secret = load_or_create_dev_secret(root / "hs256.key")
    return mint_token(secret, tenant=tenant, sub=sub, scopes=scopes.split(), ttl_s=600)
