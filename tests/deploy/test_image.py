"""The gateway image (deploy/gateway/Dockerfile), built and started: it answers /readyz,
runs a request end to end, and on SIGTERM (`docker stop`) exits cleanly with its audit
chain intact.

The image is built by deploy/gateway/build.sh from the local sandbox image (no registry
here), tagged by the hash of its inputs, so an unchanged tree is not rebuilt. The
container runs with the no-op backend: nsjail would need a privileged container and the
docker backends the engine's socket; this test is about the image and its start-up.
The engine here has no bridge, so the container shares the host's network namespace and
listens on a loopback port of its own.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.audit.chain import verify_file
from gateway.auth.tokens import mint_token
from gateway.policy.local_opa import free_port
from tests.components import missing_component
from tests.deploy.manifests import DEPLOY

pytestmark = pytest.mark.integration


def engine_ready() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def image() -> str:
    if not engine_ready():
        missing_component("no Docker engine: deploy/docker/start-dockerd.sh")
    built = subprocess.run(
        ["bash", str(DEPLOY / "gateway" / "build.sh")],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if built.returncode != 0 and "make images" in built.stderr:
        missing_component(f"the base image is missing: {built.stderr.strip()}")
    assert built.returncode == 0, built.stderr[-3000:]
    return built.stdout.strip().splitlines()[-1]


def get(url: str, token: str | None = None, body: object | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}"} if token else {},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture
def container(image: str, tmp_path: Path) -> Iterator[tuple[str, str, Path, bytes]]:
    port = free_port()
    name = f"execgate-image-test-{secrets.token_hex(4)}"
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    # A line of text, as an operator writes one (`openssl rand -base64 48 > hs256`).
    secret = secrets.token_urlsafe(48).encode("ascii")
    (tmp_path / "hs256.key").write_bytes(secret + b"\n")
    subprocess.run(
        ["docker", "run", "-d", "--name", name, "--network=host", "--read-only",
         "--tmpfs", "/var/lib/execgate", "--cap-drop=ALL", "--security-opt=no-new-privileges",
         "-v", f"{audit_dir}:/audit", "-v", f"{tmp_path / 'hs256.key'}:/run/secrets/hs256:ro",
         "-e", "EXECGATE_BACKENDS_DEFAULT=noop", "-e", "EXECGATE_SERVER_HOST=127.0.0.1",
         "-e", f"EXECGATE_SERVER_PORT={port}", "-e", "EXECGATE_AUDIT_PATH=/audit/audit.jsonl",
         "-e", "EXECGATE_AUTH_HS256_SECRET_FILE=/run/secrets/hs256", image],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        yield name, f"http://127.0.0.1:{port}", audit_dir / "audit.jsonl", secret
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def wait_ready(name: str, url: str, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status, body = get(url + "/readyz")
            if status == 200:
                return body
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.5)
    logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
    raise AssertionError(f"no /readyz 200 within {timeout_s}s: {logs.stderr[-3000:]}")


def test_the_image_starts_answers_readyz_and_stops_cleanly(
    container: tuple[str, str, Path, bytes],
) -> None:
    name, url, audit, secret = container
    body = wait_ready(name, url)
    assert body["checks"]["policy"]["ok"] and body["checks"]["backend:noop"]["ok"]

    token = mint_token(secret, tenant="acme", sub="ci", scopes=["exec:python"], ttl_s=300)
    status, result = get(url + "/v1/executions", token, {"language": "python", "code": "1"})
    assert status == 200 and result["status"] == "ok", result

    stopped = subprocess.run(
        ["docker", "stop", "--time", "30", name], capture_output=True, text=True
    )
    assert stopped.returncode == 0
    state = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.ExitCode}}", name], capture_output=True, text=True
    )
    assert state.stdout.strip() == "0", "SIGTERM should end the gateway cleanly"
    assert verify_file(audit).ok
    types = [json.loads(line)["type"] for line in audit.read_text().splitlines()]
    assert "execution.finished" in types
