"""Fixtures that build a real gateway: real nsjail, real embedded Rego, real audit log."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.auth.tokens import mint_token
from gateway.settings.model import Settings, load_settings
from tests.components import missing_component

REPO = Path(__file__).resolve().parents[2]


def require_root() -> None:
    if os.geteuid() != 0:
        missing_component("the nsjail backend needs root (cgroups, tmpfs, uid maps)")


# Only the default backend's: a backend's table in the settings enables it.
CAPTURE_OFF = {"EXECGATE_BACKENDS_NSJAIL_CAPTURE": '{"enabled": false}'}
CAPTURE_ON = {key: '{"enabled": true}' for key in CAPTURE_OFF}


# The sandbox state directories made under /tmp this run, removed when it ends.
_SANDBOX_DIRS: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _remove_sandbox_dirs() -> Iterator[None]:
    yield
    for path in _SANDBOX_DIRS:
        shutil.rmtree(path, ignore_errors=True)


def make_settings(root: Path, **env: str) -> Settings:
    # Sandbox state must not live under pytest's tmp_path: its parents are 0700 and
    # the sandbox uid has to traverse to its bind-mount sources.
    sandboxes = root / "sandbox-dir"
    if not sandboxes.is_symlink():
        real = Path(tempfile.mkdtemp(prefix="execgate-gw-test-", dir="/tmp"))
        _SANDBOX_DIRS.append(real)
        sandboxes.symlink_to(real)
    base = {
        "EXECGATE_AUDIT_PATH": str(root / "audit.jsonl"),
        "EXECGATE_STATE_PATH": str(root / "state.db"),
        "EXECGATE_AUTH_HS256_SECRET_FILE": str(root / "hs256.key"),
        "EXECGATE_APPROVALS_SIGNING_KEY_FILE": str(root / "approval-ed25519.pem"),
        # A developer may point the suite at another policy tree while editing this one.
        "EXECGATE_POLICY_PATH": os.environ.get("EXECGATE_TEST_POLICY_PATH", str(REPO / "policies")),
        "EXECGATE_BACKENDS_NSJAIL_STATE_DIR": str(sandboxes.resolve()),
        "EXECGATE_TENANTS_ACME_RATE_PER_S": "1000",
        "EXECGATE_TENANTS_ACME_BURST": "1000",
        "EXECGATE_TENANTS_ACME_MAX_CONCURRENT": "8",
        # Behaviour capture off unless a test asks for it (`CAPTURE_ON`): the host
        # tracer takes seconds of CPU to attach, once per backend start.
        **CAPTURE_OFF,
    }
    return load_settings(None, env={**base, **env})


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    require_root()
    return make_settings(tmp_path)


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings) -> TestClient:
    return await aiohttp_client(create_app(settings))


@pytest.fixture
def canary_dir() -> Iterator[Path]:
    """Host canaries for the escape suite, in a directory weakened sandboxes bind in
    (under /tmp, not pytest's 0700 tmp_path: the sandbox uid traverses to it)."""
    parent = Path(tempfile.mkdtemp(prefix="execgate-escape-canary-", dir="/tmp"))
    parent.chmod(0o755)
    # Beside it, not in it (the canaries' own directory must stay as made):
    # tests/gateway/escape/weakened.py keeps a credential canary in "secrets".
    path = parent / "canary"
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def token(settings: Settings) -> Callable[..., str]:
    """Mint a token with the gateway's development key (created on first use)."""
    from gateway.auth.keys import load_or_create_dev_secret

    def make(
        tenant: str = "acme",
        sub: str = "agent-7",
        scopes: str = "exec:python exec:bash exec:javascript",
        ttl_s: int = 600,
        **extra: Any,
    ) -> str:
        secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
        return mint_token(
            secret,
            tenant=tenant,
            sub=sub,
            scopes=scopes.split(),
            ttl_s=ttl_s,
            extra_claims=extra or None,
        )

    return make


def auth(tok: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tok}"}


def audit_records(settings: Settings) -> list[dict[str, Any]]:
    import json

    path = Path(settings.audit.path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
