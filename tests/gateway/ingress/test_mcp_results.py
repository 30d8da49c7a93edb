"""Every `tools/call` answer conforms to the tool's declared output schema, or carries
no `structuredContent` at all: the official TypeScript SDK (which most MCP hosts embed)
validates `structuredContent` against `outputSchema` on every result, error results
included, and raises a protocol error on a mismatch; the Python SDK validates results
that are not errors. One table of outcomes (ran, non-zero exit, timeout, held, refused
by scope or policy, invalid arguments, rate limited, backend unavailable, a guarded
upstream tool held or denied) is driven through both SDKs against a real gateway
(nsjail, embedded Rego, audit log) and a real upstream MCP server.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from aiohttp.test_utils import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.app import create_app
from gateway.settings.model import Settings
from tests.components import missing_component
from tests.gateway.conftest import audit_records, auth, make_settings, require_root
from tests.gateway.mcp.upstream_server import UpstreamServer

pytestmark = pytest.mark.integration

Token = Callable[..., str]
TS_CLIENT = Path(__file__).parent / "mcp_ts"


@dataclass(frozen=True)
class Case:
    label: str
    tenant: str
    scopes: str
    tool: str
    arguments: dict[str, Any]
    # "ran:<status>" for code that ran; "error:<code>" or "held" otherwise.
    expect: str


CASES = [
    Case("ok", "acme", "exec:python", "run_python", {"code": "print(1)"}, "ran:ok"),
    Case(
        "exit",
        "acme",
        "exec:python",
        "run_python",
        {"code": "raise SystemExit(3)"},
        "ran:error",
    ),
    Case(
        "timeout",
        "slowco",
        "exec:python",
        "run_python",
        {"code": "import time; time.sleep(30)"},
        "ran:timeout",
    ),
    Case(
        "output_limit",
        "chattyco",
        "exec:python",
        "run_python",
        {"code": "print('x' * 100000)"},
        "ran:output_limit",
    ),
    Case("held", "acme", "exec:python", "run_python", {"code": "import ctypes"}, "held"),
    Case("forbidden", "acme", "exec:python", "bash", {"command": "id"}, "error:forbidden"),
    Case(
        "policy_denied",
        "initech",
        "exec:javascript",
        "run_code",
        {"language": "javascript", "code": "1"},
        "error:policy_denied",
    ),
    Case(
        "backend_unavailable",
        "initech",
        "exec:python",
        "run_python",
        {"code": "print(1)"},
        "error:backend_unavailable",
    ),
    Case("invalid", "acme", "exec:python", "run_python", {"code": 5}, "error:invalid_request"),
    Case("first", "tightco", "exec:python", "run_python", {"code": "print(2)"}, "ran:ok"),
    Case(
        "rate_limited",
        "tightco",
        "exec:python",
        "run_python",
        {"code": "print(3)"},
        "error:rate_limited",
    ),
    Case(
        "guarded_held",
        "globex",
        "tool:send_email",
        "send_email",
        {"to": "cfo@example.com", "body": "hi"},
        "held",
    ),
    Case(
        "guarded_denied",
        "initech",
        "tool:*",
        "send_email",
        {"to": "x@example.com", "body": "b"},
        "error:policy_denied",
    ),
    Case("upstream_ok", "globex", "tool:echo", "echo", {"text": "hi"}, "upstream"),
]


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = UpstreamServer()
    yield server.start()
    server.stop()


@pytest.fixture
def settings(tmp_path: Path, upstream: str) -> Settings:
    require_root()
    (tmp_path / "upstream.cred").write_text("Bearer upstream-secret\n")
    mcp = {
        "upstream_url": upstream,
        "upstream_auth_value_file": str(tmp_path / "upstream.cred"),
        "guarded_tools": ["send_email"],
        "upstream_tools_cache_s": 0,
    }
    return make_settings(
        tmp_path,
        EXECGATE_INGRESS_MCP=json.dumps(mcp),
        EXECGATE_TENANTS_SLOWCO_TIMEOUT_S="1",
        EXECGATE_TENANTS_CHATTYCO_OUTPUT_BYTES="1024",
        EXECGATE_TENANTS_TIGHTCO_RATE_PER_S="0.001",
        EXECGATE_TENANTS_TIGHTCO_BURST="1",
    )


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings) -> TestClient:
    return await aiohttp_client(create_app(settings))


def _tokens(token: Token) -> dict[tuple[str, str], str]:
    return {(c.tenant, c.scopes): token(tenant=c.tenant, scopes=c.scopes) for c in CASES}


def _check(case: Case, result: dict[str, Any], schemas: dict[str, Any]) -> None:
    """One answer, as plain JSON (camelCase keys): its kind, and schema conformance."""
    structured = result.get("structuredContent")
    schema = schemas.get(case.tool)
    if structured is not None:
        assert schema is not None, (case.label, "structuredContent for a tool with no schema")
        jsonschema.validate(structured, schema)
    text = result["content"][0]["text"]
    kind, _, what = case.expect.partition(":")
    if kind == "ran":
        assert structured is not None and structured["status"] == what, (case.label, result)
        assert result["isError"] == (what != "ok")
        assert json.loads(text) == structured
    elif kind == "upstream":
        assert not result["isError"] and text == "echo: hi", (case.label, result)
    else:
        # Not a run: no structured value to mismatch; the model reads the text.
        assert structured is None and result["isError"], (case.label, result)
        said = json.loads(text)
        if kind == "held":
            assert said["status"] == "pending_approval" and said["approval_id"], said
        else:
            assert said["error"]["code"] == what, (case.label, said)


def _disable_backend(settings: Settings) -> None:
    """initech's policy obliges docker-gvisor, which this gateway does not run."""
    assert "docker-gvisor" not in settings.enabled_backends()


async def _python_sdk(
    url: str, tokens: dict[tuple[str, str], str], mode: str
) -> tuple[list[Any], dict[str, Any]]:
    answers: list[Any] = []
    schemas: dict[str, Any] = {}
    for case in CASES:
        tok = tokens[(case.tenant, case.scopes)]
        http = create_mcp_http_client(headers=auth(tok))
        async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as mcp:
            for tool in (await mcp.list_tools()).tools:
                if tool.output_schema is not None:
                    schemas[tool.name] = tool.output_schema
            # The SDK itself raises when a result that is not an error mismatches.
            result = await mcp.call_tool(case.tool, case.arguments)
        answers.append(result.model_dump(by_alias=True, exclude_none=True, mode="json"))
    return answers, schemas


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_python_sdk_results_conform(
    client: TestClient, token: Token, settings: Settings, mode: str
) -> None:
    _disable_backend(settings)
    answers, schemas = await _python_sdk(str(client.make_url("/mcp")), _tokens(token), mode)
    assert {"run_python", "run_code"} <= set(schemas)
    for case, result in zip(CASES, answers, strict=True):
        _check(case, result, schemas)
    _audited(settings)


def _node() -> str:
    node = shutil.which("node")
    sdk = TS_CLIENT / "node_modules" / "@modelcontextprotocol" / "sdk"
    if node is None or not sdk.is_dir():
        missing_component(
            "node and the MCP TypeScript SDK (npm ci --prefix tests/gateway/ingress/mcp_ts)"
        )
    assert node is not None
    return node


async def _ts_sdk(
    node: str, url: str, tok: str, cases: list[Case], progress: bool = False
) -> dict[str, Any]:
    plan = {
        "url": url,
        "token": tok,
        "calls": [{"name": c.tool, "arguments": c.arguments, "progress": progress} for c in cases],
    }
    proc = await asyncio.create_subprocess_exec(
        node,
        str(TS_CLIENT / "client.mjs"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=TS_CLIENT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    out, err = await asyncio.wait_for(proc.communicate(json.dumps(plan).encode()), 300)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def test_typescript_sdk_results_conform(
    client: TestClient, token: Token, settings: Settings
) -> None:
    node = _node()
    _disable_backend(settings)
    url = str(client.make_url("/mcp"))
    tokens = _tokens(token)
    # One TypeScript client per caller, its calls in table order (the rate-limited
    # pair needs its first call first).
    callers = list(dict.fromkeys((c.tenant, c.scopes) for c in CASES))
    for caller in callers:
        cases = [c for c in CASES if (c.tenant, c.scopes) == caller]
        ran = await _ts_sdk(node, url, tokens[caller], cases)
        # The only revision this SDK speaks is 2025-11-25 (sessions).
        assert ran["protocol"] == "2025-11-25", ran
        schemas = {t["name"]: t["outputSchema"] for t in ran["tools"] if t["outputSchema"]}
        for case, answer in zip(cases, ran["results"], strict=True):
            # A protocol error here is what a host would show: the result did not
            # match the schema the tool declared.
            assert answer["ok"], (case.label, answer)
            _check(case, answer["result"], schemas)
    _audited(settings)


def _audited(settings: Settings) -> None:
    # Each call left its terminal record: an execution that finished, a hold, or a
    # refusal with its code; none was lost on the way to the answer.
    records = audit_records(settings)
    finished = {r["status"] for r in records if r["type"] == "execution.finished"}
    assert finished >= {"ok", "error", "timeout", "output_limit"}
    codes = {r.get("code") for r in records}
    assert {"forbidden", "invalid_request", "backend_unavailable", "rate_limited"} <= codes
    assert any(r["type"] == "approval.requested" for r in records)


# Prints, sleeps (within the tools' default 5 s limit) so the run is still going when the first
# progress notification is in hand, prints again.
SLOW_PRINTS = "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n"


def _running(settings: Settings) -> set[str]:
    records = audit_records(settings)
    started = {r["execution_id"] for r in records if r["type"] == "execution.started"}
    ended = {r["execution_id"] for r in records if r["type"] == "execution.finished"}
    return started - ended


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_python_sdk_sees_progress_with_the_output_while_it_runs(
    client: TestClient, token: Token, settings: Settings, mode: str
) -> None:
    notes: list[tuple[float, str | None, set[str]]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message, _running(settings)))

    url = str(client.make_url("/mcp"))
    http = create_mcp_http_client(headers=auth(token(scopes="exec:python")))
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as mcp:
        result = await mcp.call_tool(
            "run_python", {"code": SLOW_PRINTS}, progress_callback=on_progress
        )
    # The final result is what it is without progress.
    assert not result.is_error and result.structured_content["stdout"] == "first\nsecond\n"
    assert notes, "no progress notification"
    _, message, running = notes[0]
    assert message == "first\n" and running, notes  # sent while the code ran
    assert notes[-1][1] == "first\nsecond\n"
    assert [n[0] for n in notes] == sorted({n[0] for n in notes})  # strictly increasing


async def test_typescript_sdk_sees_progress(
    client: TestClient, token: Token, settings: Settings
) -> None:
    node = _node()
    plan = [Case("progress", "acme", "exec:python", "run_python", {"code": SLOW_PRINTS}, "ran:ok")]
    url = str(client.make_url("/mcp"))
    ran = await _ts_sdk(node, url, token(scopes="exec:python"), plan, progress=True)
    (answer,) = ran["results"]
    assert answer["ok"], answer
    assert answer["result"]["structuredContent"]["stdout"] == "first\nsecond\n"
    messages = [p.get("message") for p in answer["progress"]]
    assert messages and messages[0] == "first\n" and messages[-1] == "first\nsecond\n", messages
