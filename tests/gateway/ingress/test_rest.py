"""POST /v1/executions and GET /v1/executions/{id} end to end: real HTTP, real JWT,
real embedded Rego, real nsjail, real audit log."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from aiohttp.test_utils import TestClient

from gateway.audit.chain import verify_file
from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records, auth

pytestmark = pytest.mark.integration

Token = Callable[..., str]


async def post(client: TestClient, tok: str | None, body: Any, **kw: Any) -> tuple[int, Any]:
    headers = auth(tok) if tok else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    resp = await client.post("/v1/executions", data=data, headers=headers, **kw)
    return resp.status, await resp.json()


async def test_python_runs_and_everything_is_recorded(
    client: TestClient, token: Token, settings: Settings
) -> None:
    status, body = await post(client, token(), {"language": "python", "code": "print(6*7)"})
    assert status == 200, body
    assert body["status"] == "ok" and body["exit_code"] == 0
    assert body["stdout"] == "42\n" and body["stderr"] == ""
    assert body["backend"] == "nsjail" and body["decision_id"].startswith("dec_")
    # Starting python alone takes CPU: zero would mean nothing was accounted.
    assert body["limits"]["timeout_s"] <= 30 and body["usage"]["cpu_ms"] > 0
    types = [
        r["type"] for r in audit_records(settings) if r["execution_id"] == body["execution_id"]
    ]
    assert types == ["policy.decided", "execution.started", "execution.finished"]
    assert verify_file(settings.audit.path).ok


async def test_exit_status_stdin_and_files(client: TestClient, token: Token) -> None:
    code = "read x; echo got $x; cat data.txt; echo out > result.txt; exit 3"
    status, body = await post(
        client,
        token(),
        {
            "language": "bash",
            "code": code,
            "stdin": "hello\n",
            "files": [{"path": "data.txt", "content_b64": base64.b64encode(b"file!\n").decode()}],
        },
    )
    assert status == 200, body
    assert (body["status"], body["exit_code"]) == ("error", 3)
    assert body["stdout"] == "got hello\nfile!\n"
    files = {f["path"]: base64.b64decode(f["content_b64"]) for f in body["files"]}
    assert files == {"result.txt": b"out\n"}


async def test_get_execution_same_tenant_only(client: TestClient, token: Token) -> None:
    status, body = await post(client, token(), {"language": "python", "code": "print(1)"})
    assert status == 200
    url = f"/v1/executions/{body['execution_id']}"
    resp = await client.get(url + "?wait=1", headers=auth(token()))
    record = await resp.json()
    assert resp.status == 200 and record["status"] == "done"
    assert record["result"]["stdout"] == "1\n"
    other = await client.get(url, headers=auth(token(tenant="globex")))
    assert other.status == 404
    anonymous = await client.get(url)
    assert anonymous.status == 401
    bad_wait = await client.get(url + "?wait=abc", headers=auth(token()))
    assert bad_wait.status == 400
    assert (await bad_wait.json())["error"]["fields"][0]["field"] == "wait"


async def test_timeout_is_reported(client: TestClient, token: Token) -> None:
    status, body = await post(
        client,
        token(),
        {"language": "python", "code": "import time; time.sleep(30)", "limits": {"timeout_s": 1}},
    )
    assert status == 200 and body["status"] == "timeout"
    assert body["limits"]["timeout_s"] == 1


async def test_limits_are_clamped_to_the_tenant_ceiling(client: TestClient, token: Token) -> None:
    status, body = await post(
        client,
        token(),
        {"language": "python", "code": "pass", "limits": {"timeout_s": 9999, "memory_mb": 99999}},
    )
    assert status == 200, body
    assert body["limits"]["timeout_s"] == 30 and body["limits"]["memory_mb"] == 512


# --- authentication ---------------------------------------------------------------


def _forged(settings: Settings, **overrides: Any) -> str:
    from pathlib import Path

    from gateway.auth.keys import load_or_create_dev_secret

    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    claims = {
        "sub": "x",
        "tenant": "acme",
        "scope": "exec:python",
        "iat": 1_700_000_000,
        "exp": 4_000_000_000,
    }
    claims.update(overrides)
    return jwt.encode({k: v for k, v in claims.items() if v is not None}, secret, "HS256")


def _alg_none() -> str:
    def seg(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{seg({'alg': 'none', 'typ': 'JWT'})}.{seg({'sub': 'x', 'tenant': 'acme'})}."


@pytest.mark.parametrize(
    "make_token",
    [
        pytest.param(lambda s, t: None, id="missing"),
        pytest.param(lambda s, t: "not-a-jwt", id="garbage"),
        pytest.param(lambda s, t: _forged(s, iat=1_700_000_000, exp=1_700_000_600), id="expired"),
        pytest.param(
            lambda s, t: jwt.encode(
                {"sub": "x", "tenant": "acme", "iat": 1, "exp": 4_000_000_000}, b"k" * 32, "HS256"
            ),
            id="wrong-signature",
        ),
        pytest.param(lambda s, t: _alg_none(), id="alg-none"),
        pytest.param(lambda s, t: _forged(s, tenant=None), id="missing-tenant"),
        pytest.param(lambda s, t: _forged(s, sub=None), id="missing-sub"),
    ],
)
async def test_bad_tokens_are_refused_and_audited(
    client: TestClient, token: Token, settings: Settings, make_token: Any
) -> None:
    status, body = await post(
        client, make_token(settings, token), {"language": "python", "code": "print(1)"}
    )
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    last = audit_records(settings)[-1]
    assert last["type"] == "auth.failed" and last["code"] == "unauthenticated"
    assert "Bearer" not in json.dumps(last)


async def test_missing_scope_is_forbidden_and_audited(
    client: TestClient, token: Token, settings: Settings
) -> None:
    status, body = await post(
        client, token(scopes="exec:bash"), {"language": "python", "code": "print(1)"}
    )
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert audit_records(settings)[-1]["type"] == "auth.failed"


# --- policy -----------------------------------------------------------------------


async def test_literal_and_cidr_destinations_reach_the_policy(
    client: TestClient, token: Token
) -> None:
    # Well-formed for the model (IPv6 in brackets, CIDR): the policy decides.
    egress = ["[::1]:8080", "10.0.0.0/8:443", "[fd00::/8]:443"]
    body = {"language": "python", "code": "print(1)", "network": {"egress": egress}}
    status, answer = await post(client, token(), body)
    assert status == 403 and answer["error"]["code"] == "policy_denied", answer
    assert all(any(e in r for r in answer["error"]["reasons"]) for e in egress)


async def test_policy_denial_has_reasons_and_is_audited(
    client: TestClient, token: Token, settings: Settings
) -> None:
    status, body = await post(
        client,
        token(),
        {"language": "python", "code": "print(1)", "network": {"egress": ["api.example.com:443"]}},
    )
    assert status == 403 and body["error"]["code"] == "policy_denied"
    assert any("net:egress" in r for r in body["error"]["reasons"])
    decided = [r for r in audit_records(settings) if r["type"] == "policy.decided"][-1]
    assert decided["allow"] is False and decided["decision_id"] == body["error"]["decision_id"]
    assert not [r for r in audit_records(settings) if r["type"] == "execution.started"]


async def test_native_code_is_held_for_approval(client: TestClient, token: Token) -> None:
    status, body = await post(client, token(), {"language": "python", "code": "import ctypes"})
    assert status == 202 and body["status"] == "pending_approval", body
    assert body["approval_id"].startswith("apr_") and body["reasons"]
    resp = await client.get(f"/v1/executions/{body['execution_id']}", headers=auth(token()))
    assert (await resp.json())["status"] == "pending_approval"


# --- bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"\xff\xfe{}", "body"),
        (b"[1, 2]", "body"),
        ({"code": "print(1)"}, "language"),
        ({"language": "python"}, "code"),
        ({"language": "python", "code": 42}, "code"),
        ({"language": "cobol", "code": "x"}, "language"),
        # A lone surrogate is not UTF-8 text: the decoder refuses the body, at its offset.
        ({"language": "python", "code": "\ud800"}, "body"),
        ({"language": "python", "code": "x", "surprise": 1}, "surprise"),
        ({"language": "python", "code": "x", "limits": {"timeout_s": -1}}, "limits.timeout_s"),
        ({"language": "python", "code": "x", "limits": {"memory_mb": "lots"}}, "limits.memory_mb"),
        (
            {
                "language": "python",
                "code": "x",
                "files": [{"path": "../etc/passwd", "content_b64": ""}],
            },
            "files.0.path",
        ),
        (
            {"language": "python", "code": "x", "files": [{"path": "a", "content_b64": "%%"}]},
            "files.0.content_b64",
        ),
        ({"language": "python", "code": "x", "network": {"egress": ["no port"]}}, "network.egress"),
        # Numbers the proxy would read as neither a name nor an address.
        (
            {"language": "python", "code": "x", "network": {"egress": ["127.1:80"]}},
            "network.egress",
        ),
        (
            {"language": "python", "code": "x", "network": {"egress": ["0x7f.1:80"]}},
            "network.egress",
        ),
        ({"language": "python", "code": "x", "backend": "qemu"}, "backend"),
    ],
)
async def test_bad_input_names_the_field(
    client: TestClient, token: Token, body: Any, field: str
) -> None:
    status, answer = await post(client, token(), body)
    assert status == 400, answer
    assert answer["error"]["code"] == "invalid_request"
    assert field in [f["field"] for f in answer["error"]["fields"]]
    # ...and the gateway keeps serving.
    status, ok = await post(client, token(), {"language": "python", "code": "print(1)"})
    assert status == 200 and ok["stdout"] == "1\n"


async def test_huge_body_is_413(client: TestClient, token: Token, settings: Settings) -> None:
    big = b'{"language":"python","code":"' + b"#" * (settings.server.max_body_bytes + 10) + b'"}'
    status, body = await post(client, token(), big)
    assert status == 413 and body["error"]["code"] == "too_large"


async def test_unknown_path_and_method_in_error_shape(client: TestClient) -> None:
    resp = await client.get("/v1/nothing-here")
    assert resp.status == 404 and (await resp.json())["error"]["code"] == "not_found"
    resp = await client.put("/v1/executions")
    assert resp.status == 405 and (await resp.json())["error"]["code"] == "method_not_allowed"


# --- a gateway with an audience and an RS256 key ------------------------------------


@pytest.fixture
async def rs_gateway(tmp_path: Any, aiohttp_client: Any) -> tuple[Settings, TestClient, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    from gateway.app import create_app
    from tests.gateway.conftest import make_settings

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "rs.pem").write_bytes(pem)
    settings = make_settings(
        tmp_path,
        EXECGATE_AUTH_AUDIENCE="execgate",
        EXECGATE_AUTH_PUBLIC_KEYS=json.dumps([str(tmp_path / "rs.pem")]),
    )
    return settings, await aiohttp_client(create_app(settings)), (private, pem)


def _claims(**overrides: Any) -> dict[str, Any]:
    import time

    now = int(time.time())
    claims = {
        "sub": "x",
        "tenant": "acme",
        "scope": "exec:python",
        "iat": now,
        "exp": now + 300,
        "aud": "execgate",
    }
    claims.update(overrides)
    return claims


def _hs256_with_key(key: bytes, claims: dict[str, Any]) -> str:
    """HS256 signed by hand: PyJWT refuses to use a PEM public key as an HMAC secret."""
    import hashlib
    import hmac

    def seg(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = seg(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = seg(json.dumps(claims).encode())
    sig = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{seg(sig)}"


async def test_rs256_audience_and_key_confusion(rs_gateway: Any) -> None:
    settings, client, (private, pem) = rs_gateway
    run = {"language": "python", "code": "print(1)"}
    good = jwt.encode(_claims(), private, "RS256")
    status, body = await post(client, good, run)
    assert status == 200, body

    for bad in (
        jwt.encode(_claims(aud="someone-else"), private, "RS256"),
        jwt.encode({k: v for k, v in _claims().items() if k != "aud"}, private, "RS256"),
        _hs256_with_key(pem, _claims()),  # HS/RS key confusion
    ):
        status, body = await post(client, bad, run)
        assert status == 401 and body["error"]["code"] == "unauthenticated", body
        assert audit_records(settings)[-1]["type"] == "auth.failed"
