"""An approval token redeems the one request that was approved, nothing next to it.

A real gateway (nsjail, embedded Rego, audit) with `run_held = false`, so the
requester presents the token: every neighbour of the approved request (another
language for the same polyglot bytes, files swapped, added, removed or renamed,
other stdin, another requester or tenant, another backend, other limits, added
egress, other code) is refused, names the part that differs, is audited, and leaves
the token unspent: the exact approved request still runs, once.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import jwt
import pytest

from gateway.approvals import binding as approval_binding
from tests.gateway.approvals.gateway import (  # noqa: F401 (fixtures)
    approve,
    gateway_env_fixture,
    receiver_fixture,
    sign_approval_token,
    start_fixture,
)
from tests.gateway.conftest import audit_records, auth

pytestmark = pytest.mark.integration

# Valid bash and valid Python: as bash it echoes and exits before the Python part.
POLYGLOT = '''#!/bin/bash
""":"
echo bash ran
exit 0
":"""
import ctypes, sys
sys.path.insert(0, ".")  # the workspace: where the input files are
import helper
print("python ran", ctypes.sizeof(ctypes.c_int), helper.X, sys.stdin.read())
'''


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


APPROVED: dict[str, Any] = {
    "language": "python",
    "code": POLYGLOT,
    "stdin": "hello",
    "files": [
        {"path": "helper.py", "content_b64": b64(b"X = 1\n")},
        {"path": "data.txt", "content_b64": b64(b"a,b\n1,2\n")},
    ],
    "limits": {"memory_mb": 128, "timeout_s": 10},
}


def changed(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(APPROVED)
    body.update(changes)
    return body


def with_files(*files: tuple[str, bytes]) -> dict[str, Any]:
    return changed(files=[{"path": p, "content_b64": b64(c)} for p, c in files])


HELPER, DATA = ("helper.py", b"X = 1\n"), ("data.txt", b"a,b\n1,2\n")

# name -> (request, who presents it (sub, tenant), the parts that must be named)
NEIGHBOURS: dict[str, tuple[dict[str, Any], tuple[str, str], list[str]]] = {
    "polyglot as bash": (changed(language="bash"), ("agent-7", "acme"), ["language"]),
    "other code": (changed(code=POLYGLOT + "#\n"), ("agent-7", "acme"), ["code"]),
    "file swapped": (
        with_files(("helper.py", b"import ctypes\nX = 1\n"), DATA),
        ("agent-7", "acme"),
        ["files"],
    ),
    "file added": (with_files(HELPER, DATA, ("ctypes.py", b"")), ("agent-7", "acme"), ["files"]),
    "file removed": (with_files(HELPER), ("agent-7", "acme"), ["files"]),
    "file renamed": (with_files(HELPER, ("data2.txt", DATA[1])), ("agent-7", "acme"), ["files"]),
    "stdin changed": (changed(stdin="other"), ("agent-7", "acme"), ["stdin"]),
    "stdin dropped": (changed(stdin=""), ("agent-7", "acme"), ["stdin"]),
    "other requester, same tenant": (APPROVED, ("agent-8", "acme"), ["requester"]),
    "other tenant": (APPROVED, ("agent-7", "globex"), ["tenant"]),
    "other backend": (changed(backend="noop"), ("agent-7", "acme"), ["backend"]),
    "limits raised": (
        changed(limits={"memory_mb": 256, "timeout_s": 10}),
        ("agent-7", "acme"),
        ["limits"],
    ),
    "limit added": (
        changed(limits={"memory_mb": 128, "timeout_s": 10, "pids": 512}),
        ("agent-7", "acme"),
        ["limits"],
    ),
    "egress added": (
        changed(network={"egress": ["api.example.com:443"]}),
        ("agent-7", "acme"),
        ["egress"],
    ),
    "several at once": (
        changed(language="bash", stdin="x", limits={}),
        ("agent-7", "acme"),
        ["language", "stdin", "limits"],
    ),
}


async def test_a_token_redeems_only_the_request_it_approved(start: Any) -> None:
    # A second backend (noop) so that "another backend" is a request the gateway takes.
    gw, client = await start(
        EXECGATE_APPROVALS_RUN_HELD="false", EXECGATE_BACKENDS_NOOP_SLEEP_S="0"
    )
    scopes = "exec:python exec:bash"
    resp = await client.post("/v1/executions", json=APPROVED, headers=auth(gw.token(scopes=scopes)))
    held = await resp.json()
    assert resp.status == 202, held
    token = await approve(gw, client, held["approval_id"])
    claims = jwt.decode(token, options={"verify_signature": False})
    # The SPEC's claims stay; the binding is the documented version.
    assert claims["tenant"] == "acme" and claims["sub"] == "agent-7"
    assert claims["limits"] == {"memory_mb": 128, "timeout_s": 10}
    assert claims["binding"]["v"] == approval_binding.VERSION
    assert set(claims["binding"]["parts"]) == set(approval_binding.PARTS)

    async def present(body: dict[str, Any], sub: str, tenant: str) -> tuple[int, Any]:
        headers = auth(gw.token(sub=sub, tenant=tenant, scopes=scopes))
        r = await client.post(
            "/v1/executions", json=dict(body, approval_token=token), headers=headers
        )
        return r.status, await r.json()

    for name, (body, (sub, tenant), parts) in NEIGHBOURS.items():
        status, answer = await present(body, sub, tenant)
        assert status == 403, (name, answer)
        error = answer["error"]
        assert error["code"] == "approval_invalid" and error["reason"] == "request_mismatch", name
        assert error["mismatch"] == parts, (name, error)
        assert all(part in error["message"] for part in parts), name

    refused = [r for r in audit_records(gw.settings) if r["type"] == "approval.refused"]
    assert [r["mismatch"] for r in refused] == [parts for _, _, parts in NEIGHBOURS.values()]
    assert {r["approval_id"] for r in refused} == {held["approval_id"]}
    assert all(r["reason"] == "request_mismatch" for r in refused)
    rejected = [
        r
        for r in audit_records(gw.settings)
        if r["type"] == "request.rejected" and r["code"] == "approval_invalid"
    ]
    assert len(rejected) == len(NEIGHBOURS)
    assert not [r for r in audit_records(gw.settings) if r["type"] == "execution.started"]

    # Nothing above spent it: the approved request runs, as Python, with its own inputs.
    status, result = await present(APPROVED, "agent-7", "acme")
    assert status == 200, result
    assert result["stdout"] == "python ran 4 1 hello\n", result["stderr"]
    assert result["backend"] == "nsjail"
    status, again = await present(APPROVED, "agent-7", "acme")
    assert status == 403 and again["error"]["reason"] == "reused", again
    started = [r for r in audit_records(gw.settings) if r["type"] == "execution.started"]
    assert len(started) == 1


async def test_a_token_of_an_unknown_binding_version_is_refused(start: Any) -> None:
    gw, client = await start(EXECGATE_APPROVALS_RUN_HELD="false")
    held_body = {"language": "python", "code": "import ctypes\nprint(2)\n"}
    resp = await client.post("/v1/executions", json=held_body, headers=auth(gw.token()))
    held = await resp.json()
    token = await approve(gw, client, held["approval_id"])
    claims = jwt.decode(token, options={"verify_signature": False})
    # Signed with the gateway's own key, so only the binding is wrong.
    for binding in (
        dict(claims["binding"], v="execgate.approval-binding/v0"),
        {"v": approval_binding.VERSION, "sha256": claims["binding"]["sha256"]},
        {},
    ):
        forged = sign_approval_token(gw.settings, dict(claims, binding=binding))
        resp = await client.post(
            "/v1/executions", json=dict(held_body, approval_token=forged), headers=auth(gw.token())
        )
        answer = await resp.json()
        assert resp.status == 403 and answer["error"]["reason"] == "request_mismatch", answer
        assert answer["error"]["mismatch"] == list(approval_binding.PARTS)
    resp = await client.post(
        "/v1/executions", json=dict(held_body, approval_token=token), headers=auth(gw.token())
    )
    assert resp.status == 200 and (await resp.json())["stdout"] == "2\n"
