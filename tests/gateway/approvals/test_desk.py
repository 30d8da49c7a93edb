"""Human approval end to end: a real gateway (nsjail, Rego, audit), a real webhook
receiver on 127.0.0.1 that verifies signatures with the Standard Webhooks reference
library, approvers with their own tokens, restarts, and token attacks. The gateway
and receiver fixtures are tests/gateway/approvals/gateway.py's."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from tests.gateway.approvals.gateway import (  # noqa: F401 (fixtures)
    NATIVE,
    SECRET,
    Receiver,
    approve,
    gateway_env_fixture,
    hold,
    receiver_fixture,
    sign_approval_token,
    signed_callback,
    start_fixture,
    wait_for,
)
from tests.gateway.conftest import audit_records, auth
from tests.waiting import until

pytestmark = pytest.mark.integration


async def test_approve_then_the_held_execution_runs_once(
    start: Any, receiver: tuple[Receiver, str]
) -> None:
    gw, client = await start()
    held = await hold(gw, client)
    await wait_for(lambda: bool(receiver[0].received))
    data = receiver[0].received[0]["data"]
    assert receiver[0].received[0]["type"] == "approval.requested"
    assert data["approval_id"] == held["approval_id"] and data["code"] == NATIVE["code"]
    assert data["code_sha256"] == hashlib.sha256(NATIVE["code"].encode()).hexdigest()
    assert "native_code" in data["features"] and data["reasons"]
    assert data["links"]["decision"].endswith(f"/v1/approvals/{held['approval_id']}/decision")

    url = f"/v1/approvals/{held['approval_id']}/decision"
    resp = await client.post(
        url, json={"decision": "approve", "reason": "looks fine"}, headers=gw.approver()
    )
    decided = await resp.json()
    assert resp.status == 200, decided
    assert decided["status"] == "approved" and decided["approval_token"]
    claims = jwt.decode(decided["approval_token"], options={"verify_signature": False})
    assert claims["aud"] == "execgate:approval" and claims["tenant"] == "acme"

    resp = await client.get(
        f"/v1/executions/{held['execution_id']}?wait=20", headers=auth(gw.token())
    )
    record = await resp.json()
    assert record["status"] == "done", record
    assert record["result"]["stdout"] == "4\n"
    approval = await (
        await client.get(f"/v1/approvals/{held['approval_id']}", headers=gw.approver())
    ).json()
    assert approval["status"] == "executed"

    types = [
        r["type"]
        for r in audit_records(gw.settings)
        if r.get("execution_id") == held["execution_id"]
    ]
    for expected in (
        "approval.requested",
        "approval.delivered",
        "approval.decided",
        "execution.finished",
    ):
        assert expected in types
    assert types.count("execution.started") == 1
    decided_records = [r for r in audit_records(gw.settings) if r["type"] == "policy.decided"]
    assert decided_records[-1]["allow"] is True

    # Deciding again the same way is idempotent; the other way is a conflict.
    again = await client.post(url, json={"decision": "approve"}, headers=gw.approver())
    assert again.status == 200 and "approval_token" not in await again.json()
    other = await client.post(url, json={"decision": "deny"}, headers=gw.approver())
    assert other.status == 409


async def test_deny_self_approval_and_scope(start: Any) -> None:
    gw, client = await start()
    held = await hold(gw, client)
    url = f"/v1/approvals/{held['approval_id']}/decision"
    self_approval = await client.post(
        url, json={"decision": "approve"}, headers=gw.approver(sub="agent-7")
    )
    assert self_approval.status == 403
    no_scope = await client.post(
        url, json={"decision": "approve"}, headers=auth(gw.token(sub="mallory"))
    )
    assert no_scope.status == 404  # may not even see it
    bad = await client.post(url, json={"decision": "maybe"}, headers=gw.approver())
    assert bad.status == 400
    resp = await client.post(
        url, json={"decision": "deny", "reason": "no native code"}, headers=gw.approver()
    )
    assert resp.status == 200 and (await resp.json())["status"] == "denied"
    record = await (
        await client.get(f"/v1/executions/{held['execution_id']}", headers=auth(gw.token()))
    ).json()
    assert record["status"] == "failed" and record["error"]["code"] == "approval_denied"
    assert not [r for r in audit_records(gw.settings) if r["type"] == "execution.started"]
    listing = await (await client.get("/v1/approvals?status=denied", headers=gw.approver())).json()
    assert [a["approval_id"] for a in listing["approvals"]] == [held["approval_id"]]


async def test_signed_callback_decides(start: Any) -> None:
    gw, client = await start()
    held = await hold(gw, client)
    url = f"/v1/approvals/{held['approval_id']}/decision"
    decision = {
        "approval_id": held["approval_id"],
        "decision": "deny",
        "reason": "via chat",
        "approver": "carol",
    }
    body, headers = signed_callback(decision, "msg_cb")
    _, forged = signed_callback(decision, "msg_cb", secret=SECRET)
    assert (await client.post(url, data=body, headers=forged)).status == 401
    resp = await client.post(url, data=body, headers=headers)
    decided = await resp.json()
    assert resp.status == 200 and decided["approver"] == "carol", decided
    assert decided["status"] == "denied" and "approval_token" not in decided


async def test_delivery_is_retried_and_every_attempt_audited(
    start: Any, receiver: tuple[Receiver, str]
) -> None:
    receiver[0].failures = 2
    gw, client = await start()
    held = await hold(gw, client)
    await wait_for(lambda: bool(receiver[0].received))

    def attempts() -> list[dict[str, Any]]:
        return [r for r in audit_records(gw.settings) if r["type"] == "approval.delivered"]

    await wait_for(lambda: any(r["delivered"] for r in attempts()))
    got = attempts()
    assert [r["status_code"] for r in got] == [500, 500, 204]
    assert all(r["approval_id"] == held["approval_id"] for r in got)


async def test_a_receiver_that_never_answers_leaves_the_approval_pending(
    start: Any, receiver: tuple[Receiver, str]
) -> None:
    receiver[0].hang_s = 5
    gw, client = await start(
        EXECGATE_APPROVALS_DELIVERY_TIMEOUT_S="0.3", EXECGATE_APPROVALS_DELIVERY_ATTEMPTS="2"
    )
    held = await hold(gw, client)
    url = f"/v1/approvals/{held['approval_id']}"

    async def delivery() -> dict[str, Any]:
        return (await (await client.get(url, headers=gw.approver())).json())["delivery"]

    deadline = time.monotonic() + 10
    while (await delivery())["status"] != "failed":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    approval = await (await client.get(url, headers=gw.approver())).json()
    assert approval["status"] == "pending" and "error" in approval["delivery"]
    attempts = [r for r in audit_records(gw.settings) if r["type"] == "approval.delivered"]
    assert len(attempts) == 2 and attempts[-1]["final"] is True and "error" in attempts[-1]


async def test_pending_approvals_survive_a_restart_and_expire_on_time(start: Any) -> None:
    gw, client = await start(EXECGATE_APPROVALS_TTL_S="3")
    kept = await hold(gw, client)
    await gw.stop()

    gw2, client2 = await start(EXECGATE_APPROVALS_TTL_S="3")
    approval = await (
        await client2.get(f"/v1/approvals/{kept['approval_id']}", headers=gw2.approver())
    ).json()
    assert approval["status"] == "pending"
    await gw2.stop()
    # Until its expiry has passed (by the wall clock the store uses), whatever the load.
    expires = datetime.fromisoformat(approval["expires_at"]).timestamp()
    await until(lambda: time.time() > expires, what="the approval's expiry passed")

    gw3, client3 = await start(EXECGATE_APPROVALS_TTL_S="3")
    approval = await (
        await client3.get(f"/v1/approvals/{kept['approval_id']}", headers=gw3.approver())
    ).json()
    assert approval["status"] == "expired"
    late = await client3.post(
        f"/v1/approvals/{kept['approval_id']}/decision",
        json={"decision": "approve"},
        headers=gw3.approver(),
    )
    assert late.status == 409 and (await late.json())["error"]["code"] == "approval_expired"
    assert any(r["type"] == "approval.expired" for r in audit_records(gw3.settings))


async def test_a_restart_between_request_and_approval_still_runs_it(start: Any) -> None:
    gw, client = await start()
    held = await hold(gw, client)
    await gw.stop()
    gw2, client2 = await start()
    resp = await client2.post(
        f"/v1/approvals/{held['approval_id']}/decision",
        json={"decision": "approve"},
        headers=gw2.approver(),
    )
    assert resp.status == 200
    record = await (
        await client2.get(
            f"/v1/executions/{held['execution_id']}?wait=20", headers=auth(gw2.token())
        )
    ).json()
    assert record["status"] == "done" and record["result"]["stdout"] == "4\n", record


# --- tokens presented by the requester (run_held = false) ---------------------------


def _hs256(key: bytes, claims: dict[str, Any]) -> str:
    def seg(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    head = seg(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    body = seg(json.dumps(claims).encode())
    mac = hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{seg(mac)}"


async def test_approval_token_is_single_use_and_bound(start: Any) -> None:
    gw, client = await start(EXECGATE_APPROVALS_RUN_HELD="false")
    held = await hold(gw, client, {**NATIVE, "limits": {"memory_mb": 128}})
    token = await approve(gw, client, held["approval_id"])
    claims = jwt.decode(token, options={"verify_signature": False})

    async def present(body: dict[str, Any], tenant: str = "acme") -> tuple[int, Any]:
        r = await client.post("/v1/executions", json=body, headers=auth(gw.token(tenant=tenant)))
        return r.status, await r.json()

    public_pem = (
        serialization.load_pem_private_key(
            Path(gw.settings.approvals.signing_key_file).read_bytes(), password=None
        )
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    head, payload, sig = token.split(".")
    tampered_claims = dict(claims, limits={"memory_mb": 4096})
    tampered_payload = (
        base64.urlsafe_b64encode(json.dumps(tampered_claims).encode()).rstrip(b"=").decode()
    )
    none_token = ".".join(
        [
            base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode(),
            payload,
            "",
        ]
    )
    attacks = {
        "different code": (
            {"language": "python", "code": "import ctypes\n", "approval_token": token},
            "acme",
        ),
        "larger limits": (
            {**NATIVE, "limits": {"memory_mb": 256}, "approval_token": token},
            "acme",
        ),
        "unapproved egress": (
            {**NATIVE, "network": {"egress": ["example.com:443"]}, "approval_token": token},
            "acme",
        ),
        "wrong tenant": ({**NATIVE, "approval_token": token}, "globex"),
        "tampered payload": (
            {**NATIVE, "approval_token": f"{head}.{tampered_payload}.{sig}"},
            "acme",
        ),
        "alg none": ({**NATIVE, "approval_token": none_token}, "acme"),
        "key confusion": ({**NATIVE, "approval_token": _hs256(public_pem, claims)}, "acme"),
        "wrong audience": (
            {
                **NATIVE,
                "approval_token": sign_approval_token(gw.settings, dict(claims, aud="execgate")),
            },
            "acme",
        ),
        "expired": (
            {
                **NATIVE,
                "approval_token": sign_approval_token(
                    gw.settings, dict(claims, exp=int(time.time()) - 10, jti="other")
                ),
            },
            "acme",
        ),
        "garbage": ({**NATIVE, "approval_token": "not.a.token"}, "acme"),
    }
    for name, (body, tenant) in attacks.items():
        status, answer = await present(body, tenant)
        assert status == 403 and answer["error"]["code"] == "approval_invalid", (name, answer)

    status, result = await present(
        {**NATIVE, "limits": {"memory_mb": 128}, "approval_token": token}
    )
    assert status == 200 and result["stdout"] == "4\n", result
    assert result["limits"]["memory_mb"] == 128
    status, answer = await present(
        {**NATIVE, "limits": {"memory_mb": 128}, "approval_token": token}
    )
    assert status == 403 and answer["error"]["reason"] == "reused"
    refused = [
        r
        for r in audit_records(gw.settings)
        if r["type"] == "request.rejected" and r["code"] == "approval_invalid"
    ]
    assert len(refused) == len(attacks) + 1
