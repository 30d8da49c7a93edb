"""A real gateway (nsjail, embedded Rego, audit log) for console tests, and a way to
sign in to it the way a browser does (form post with an Origin)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.settings.model import Settings
from tests.gateway.conftest import auth, make_settings, require_root

# Held by the default policy: loading native code needs a person's approval.
NATIVE = {"language": "python", "code": "import ctypes\nprint('ran', ctypes.sizeof(ctypes.c_int))"}
# Code that would run in the approver's browser if the console forgot to escape it.
HOSTILE = {
    "language": "python",
    "code": "import ctypes\n# </pre><script>alert(1)</script><img src=x onerror=alert(2)>",
}
CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    require_root()
    # globex admits one execution and then refuses: the health page counts refusals.
    return make_settings(
        tmp_path, EXECGATE_TENANTS_GLOBEX_BURST="1", EXECGATE_TENANTS_GLOBEX_RATE_PER_S="0.001"
    )


@pytest.fixture
async def gateway(aiohttp_client: Any, settings: Settings) -> TestClient:
    return await aiohttp_client(create_app(settings), server_kwargs={"host": "127.0.0.1"})


def origin(client: TestClient) -> dict[str, str]:
    return {"Origin": str(client.make_url("/")).rstrip("/")}


async def sign_in(client: TestClient, token: str) -> str:
    """Sign in with `token`; return the CSRF token of the new session."""
    resp = await client.post(
        "/console/signin", data={"token": token}, headers=origin(client), allow_redirects=False
    )
    assert resp.status == 303, await resp.text()
    page = await (await client.get("/console/")).text()
    match = CSRF.search(page)
    assert match, page
    return match.group(1)


async def hold(
    client: TestClient, token: Callable[..., str], body: dict[str, Any] = NATIVE
) -> dict[str, Any]:
    resp = await client.post("/v1/executions", json=body, headers=auth(token(sub="agent-7")))
    body = await resp.json()
    assert resp.status == 202, body
    return body
