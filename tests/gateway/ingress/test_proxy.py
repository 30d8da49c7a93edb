"""ingress.routes against a real upstream HTTP server on 127.0.0.1: pass-through
(headers, credentials, a streamed SSE answer read before it ends), intercepted
requests through the pipeline (nsjail, Rego, audit), upstream down and too slow.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records, auth, make_settings, require_root

pytestmark = pytest.mark.integration

Token = Callable[..., str]
SECRET = "sk-upstream-of-the-gateway"
# Pass-through needs the route's scope (default "proxy:<prefix>").
SCOPES = "exec:python exec:bash exec:javascript proxy:llm proxy:down"


class Upstream:
    """Records what it receives; /sse streams until the test releases it."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/api/echo", self.echo)
        app.router.add_get("/api/sse", self.sse)
        app.router.add_get("/api/slow", self.slow)
        app.router.add_post("/api/run", self.echo)
        self.server = TestServer(app, host="127.0.0.1")

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.seen.append({"headers": dict(request.headers), "path": request.path_qs, "body": body})
        return web.json_response(
            {"path": request.path_qs, "method": request.method, "bytes": len(body)},
            headers={"X-Upstream": "yes", "Connection": "close"},
        )

    async def sse(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: first\n\n")
        await self.release.wait()  # the test reads "first" before this returns
        await resp.write(b"data: second\n\n")
        await resp.write_eof()
        return resp

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(10)
        return web.Response(text="late")


@pytest.fixture
async def upstream() -> Any:
    up = Upstream()
    await up.server.start_server()
    yield up
    up.release.set()
    await up.server.close()


def _routes(tmp_path: Path, url: str) -> str:
    (tmp_path / "cred").write_text(SECRET + "\n")
    return json.dumps(
        [
            {
                "prefix": "/llm/",
                "upstream_url": url + "/api",
                "credential_header": "Authorization",
                "credential_value_file": str(tmp_path / "cred"),
                "read_timeout_s": 1,
                "forward_headers": ["X-Custom"],
                "intercept": [
                    {
                        "method": "POST",
                        "path": "/llm/run",
                        "language_pointer": "/lang",
                        "code_pointer": "/source/text",
                        "files_pointer": "/attachments",
                        "answer_template": {"object": "run", "run": {}},
                        "answer_pointers": {
                            "stdout": "/run/output",
                            "exit_code": "/run/code",
                            "error": "/error",
                            "approval_id": "/approval",
                        },
                    }
                ],
            },
            {"prefix": "/open", "upstream_url": url + "/api", "auth": "none"},
            {"prefix": "/down", "upstream_url": "http://127.0.0.1:9/"},
        ]
    )


@pytest.fixture
def settings(tmp_path: Path, upstream: Upstream) -> Settings:
    require_root()
    url = str(upstream.server.make_url("")).rstrip("/")
    return make_settings(tmp_path, EXECGATE_INGRESS_ROUTES=_routes(tmp_path, url))


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings) -> TestClient:
    return await aiohttp_client(create_app(settings))


async def test_pass_through_swaps_credentials_and_strips_hop_headers(
    client: TestClient, token: Token, upstream: Upstream, settings: Settings
) -> None:
    tok = token(scopes=SCOPES)
    resp = await client.post(
        "/llm/echo?x=1",
        data=b"x" * 200_000,
        headers={
            **auth(tok),
            "X-Custom": "kept",
            "Connection": "keep-alive, X-Drop-Me",
            "X-Drop-Me": "hop",
            "X-Forwarded-For": "6.6.6.6",
            "Proxy-Authorization": f"Bearer {tok}",
        },
    )
    assert resp.status == 200
    assert await resp.json() == {"path": "/api/echo?x=1", "method": "POST", "bytes": 200_000}
    assert resp.headers["X-Upstream"] == "yes"
    seen = upstream.seen[-1]["headers"]
    assert seen["Authorization"] == SECRET  # the route's credential, not the caller's
    assert tok not in json.dumps(upstream.seen[-1]["headers"])
    assert seen["X-Custom"] == "kept" and "X-Drop-Me" not in seen
    assert seen["X-Forwarded-For"] == "127.0.0.1"  # set by the gateway, not copied
    records = [r for r in audit_records(settings) if r["type"] == "proxy.forwarded"]
    assert records[-1]["route"] == "/llm" and records[-1]["status"] == 200

    # Pass-through needs an execgate token unless the route says auth = "none".
    assert (await client.get("/llm/echo")).status == 401
    open_resp = await client.get("/open/echo", headers={"Authorization": "Bearer mine"})
    assert open_resp.status == 200
    assert "Authorization" not in upstream.seen[-1]["headers"]
    # Dot segments cannot climb out of the route's base path at the upstream.
    for path in ("/llm/../secret", "/llm/%2e%2e/secret", "/llm/a/./b"):
        url = client.make_url("").with_path(path, encoded=True)
        resp = await client.session.get(url, headers=auth(tok))
        assert resp.status == 400, path
    # Gateway routes are untouched by the catch-alls.
    assert (await client.get("/healthz")).status == 200


async def test_sse_is_streamed_not_buffered(
    client: TestClient, token: Token, upstream: Upstream
) -> None:
    resp = await client.get("/llm/sse", headers=auth(token(scopes=SCOPES)))
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
    first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=30)
    assert first == b"data: first\n\n"  # arrived while the upstream is still open
    upstream.release.set()
    assert await resp.content.read() == b"data: second\n\n"


async def test_intercepted_request_runs_in_the_sandbox_in_upstream_shape(
    client: TestClient, token: Token, upstream: Upstream, settings: Settings
) -> None:
    before = len(upstream.seen)
    body = {"lang": "python", "source": {"text": "print(6*7)"}}
    resp = await client.post("/llm/run", json=body, headers=auth(token()))
    assert resp.status == 200
    assert await resp.json() == {"object": "run", "run": {"output": "42\n", "code": 0}}
    assert len(upstream.seen) == before  # never reached the upstream
    assert any(r["type"] == "execution.finished" for r in audit_records(settings))

    with_file = {
        "lang": "python",
        "source": {"text": "print(open('a.txt').read())"},
        "attachments": [{"path": "a.txt", "content_b64": base64.b64encode(b"hello").decode()}],
    }
    resp = await client.post("/llm/run", json=with_file, headers=auth(token()))
    assert (await resp.json())["run"]["output"] == "hello\n"

    # No token, a denial, malformed bodies: the same shape, the gateway's status.
    resp = await client.post("/llm/run", json=body)
    assert resp.status == 401
    assert (await resp.json())["error"]["code"] == "unauthenticated"
    resp = await client.post("/llm/run", json=body, headers=auth(token(scopes="exec:bash")))
    answer = await resp.json()
    assert resp.status == 403 and answer["object"] == "run"
    assert answer["error"]["code"] == "forbidden"
    resp = await client.post("/llm/run", data=b"{oops", headers=auth(token()))
    assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_request"
    resp = await client.post("/llm/run", json={"lang": "python"}, headers=auth(token()))
    assert resp.status == 400
    records = audit_records(settings)
    refused = [r for r in records if r.get("ingress") == "proxy" and r["type"] != "policy.decided"]
    assert {r["code"] for r in refused} >= {"unauthenticated", "forbidden", "invalid_request"}


@pytest.mark.parametrize(
    "path", ["/llm//run", "/llm/./run", "/llm/run/", "/llm/%72un", "/llm/RUN", "/llm/x/../run"]
)
async def test_other_spellings_of_an_intercepted_path_never_reach_upstream(
    client: TestClient, token: Token, upstream: Upstream, path: str
) -> None:
    before = len(upstream.seen)
    body = {"lang": "python", "source": {"text": "print(1)"}}
    url = client.make_url("").with_path(path, encoded=True)
    resp = await client.session.post(url, json=body, headers=auth(token()))
    if "." in path:  # dot segments are refused outright, never resolved
        assert resp.status == 400, await resp.text()
    else:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["run"]["output"] == "1\n"
    assert len(upstream.seen) == before


async def test_upstream_down_and_slow(client: TestClient, token: Token) -> None:
    resp = await client.get("/down/anything", headers=auth(token(scopes=SCOPES)))
    assert resp.status == 502
    assert (await resp.json())["error"]["code"] == "upstream_unavailable"
    resp = await client.get("/llm/slow", headers=auth(token(scopes=SCOPES)))
    assert resp.status == 504
    assert (await resp.json())["error"]["code"] == "upstream_timeout"


def test_routes_may_not_shadow_the_gateway(tmp_path: Path) -> None:
    from gateway.settings.model import SettingsError

    for prefix in ("/v1", "/v1/executions", "/mcp", "/", "/healthz"):
        routes = json.dumps([{"prefix": prefix, "upstream_url": "http://127.0.0.1:1"}])
        with pytest.raises(SettingsError, match="prefix"):
            make_settings(tmp_path, EXECGATE_INGRESS_ROUTES=routes)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"lang":"python","source":{"text":"print(1)"},"x":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}",
        b'{"lang":"python","source":{"text":"print(1)"},"lang":"bash"}',
        b'{"lang":"python","source":{"text":"print(1)","text":"import os"}}',
        b'{"lang":"python","source":{"text":"print(1)"},"attachments":[{"path":"a","content_b64":"","path":"b"}]}',
    ],
    ids=["deep", "deep inside", "duplicate language", "duplicate code", "duplicate in files"],
)
async def test_intercepted_bombs_and_duplicates_are_refused_in_upstream_shape(
    client: TestClient, token: Token, upstream: Upstream, settings: Settings, raw: bytes
) -> None:
    before = len(upstream.seen)
    resp = await client.post("/llm/run", data=raw, headers=auth(token()))
    answer = await resp.json()
    assert resp.status == 400 and answer["object"] == "run", answer
    assert answer["error"]["code"] == "invalid_request"
    assert len(upstream.seen) == before
    refused = [r for r in audit_records(settings) if r["type"] == "request.rejected"]
    assert refused and refused[-1]["ingress"] == "proxy"
    assert not [r for r in audit_records(settings) if r["type"] == "execution.finished"]
