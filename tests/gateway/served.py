"""A real `execgate serve` in a subprocess, for tests of what only a process shows:
signals, crashes, restarts, logs. Configured through EXECGATE_* variables only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token
from gateway.policy.local_opa import free_port
from gateway.settings.model import BUILT_TOOLS_ENV

REPO = Path(__file__).resolve().parents[2]


def gateway_env(root: Path, **overrides: str) -> dict[str, str]:
    """Everything under `root`; nsjail's state under /tmp (its parents must be searchable)."""
    sandboxes = Path(tempfile.mkdtemp(prefix="execgate-served-", dir="/tmp"))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("EXECGATE_") or k in BUILT_TOOLS_ENV
    }
    env.update(
        EXECGATE_AUDIT_PATH=str(root / "audit.jsonl"),
        EXECGATE_STATE_PATH=str(root / "state.db"),
        EXECGATE_AUTH_HS256_SECRET_FILE=str(root / "hs256.key"),
        EXECGATE_APPROVALS_SIGNING_KEY_FILE=str(root / "approval-ed25519.pem"),
        EXECGATE_POLICY_PATH=str(REPO / "policies"),
        EXECGATE_BACKENDS_NSJAIL_STATE_DIR=str(sandboxes),
        EXECGATE_TENANTS_ACME_RATE_PER_S="1000",
        EXECGATE_TENANTS_ACME_BURST="1000",
        EXECGATE_TENANTS_ACME_MAX_CONCURRENT="8",
        EXECGATE_SERVER_PORT=str(free_port()),
    )
    env.update(overrides)
    return env


class ServedGateway:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.url = f"http://127.0.0.1:{env['EXECGATE_SERVER_PORT']}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServedGateway:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway", "serve"],
                env=self.env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    async def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
                try:
                    async with session.get(self.url + "/readyz") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
        raise AssertionError(f"gateway not ready in {timeout_s}s: {self.log.read_text()[-3000:]}")

    def token(self, scopes: str = "exec:python exec:bash", tenant: str = "acme") -> str:
        secret = load_or_create_dev_secret(Path(self.env["EXECGATE_AUTH_HS256_SECRET_FILE"]))
        return mint_token(secret, tenant=tenant, sub="agent", scopes=scopes.split(), ttl_s=600)

    async def execute(
        self, code: str, language: str = "python", timeout_s: float = 60.0, **body: Any
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {self.token()}"}
        payload = {"language": language, "code": code, **body}
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(self.url + "/v1/executions", json=payload, headers=headers) as response,
        ):
            return response.status, await response.json()

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    async def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        return await asyncio.to_thread(self.proc.wait, timeout_s)

    def stop(self) -> None:
        """SIGTERM (its sandboxes made ahead are disposed of), SIGKILL if it hangs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait(30)
        # Its sandbox state directory, once nothing is mounted in it any more.
        state = Path(self.env["EXECGATE_BACKENDS_NSJAIL_STATE_DIR"])
        runs = state / "runs"
        if state.name.startswith("execgate-served-") and not (
            runs.is_dir() and any(runs.iterdir())
        ):
            shutil.rmtree(state, ignore_errors=True)

    def audit(self) -> list[dict[str, Any]]:
        path = Path(self.env["EXECGATE_AUDIT_PATH"])
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    async def wait_audit(self, predicate: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            records = self.audit()
            if predicate(records):
                return records
            await asyncio.sleep(0.1)
        raise AssertionError(f"audit log never matched: {[r['type'] for r in self.audit()]}")


@pytest.fixture
def sandbox_ids() -> Iterator[dict[str, str]]:
    """A sandbox uid and cgroup parent no other test uses, so leftovers are this test's;
    the parent cgroups are removed afterwards."""
    uid = str(170000 + secrets.randbelow(10000))
    parent = f"/execgate-test-{secrets.token_hex(4)}"
    yield {
        "EXECGATE_BACKENDS_NSJAIL_SANDBOX_UID": uid,
        "EXECGATE_BACKENDS_NSJAIL_SANDBOX_GID": uid,
        "EXECGATE_BACKENDS_NSJAIL_CGROUP_PARENT": parent,
    }
    for controller in Path("/sys/fs/cgroup").iterdir():
        with contextlib.suppress(OSError):
            (controller / parent.lstrip("/")).rmdir()
