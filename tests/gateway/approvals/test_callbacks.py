"""A signed decision callback decides the approval it names, once, and hands out no token.

Callbacks are signed with the Standard Webhooks reference signer (`standardwebhooks`)
and sent over real HTTP to a real gateway (nsjail, embedded Rego, audit): a callback
captured for one approval replayed to another (same or other tenant), the same
message twice, its webhook id reused for another body, a stale timestamp, a tampered
body. Each refusal is audited (`approval.callback_refused`, with a stable reason).
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.gateway.approvals.gateway import (  # noqa: F401 (fixtures)
    NATIVE,
    Gateway,
    gateway_env_fixture,
    receiver_fixture,
    signed_callback,
    start_fixture,
)
from tests.gateway.conftest import audit_records, auth

pytestmark = pytest.mark.integration


async def held_for(gw: Gateway, client: TestClient, tenant: str = "acme") -> dict[str, Any]:
    resp = await client.post("/v1/executions", json=NATIVE, headers=auth(gw.token(tenant=tenant)))
    held = await resp.json()
    assert resp.status == 202, held
    return held


async def status_of(gw: Gateway, client: TestClient, approval_id: str, tenant: str) -> str:
    headers = auth(gw.token(sub="bob", tenant=tenant, scopes="approvals:read"))
    resp = await client.get(f"/v1/approvals/{approval_id}", headers=headers)
    return str((await resp.json())["status"])


def refusals(gw: Gateway) -> list[str]:
    return [
        r["reason"] for r in audit_records(gw.settings) if r["type"] == "approval.callback_refused"
    ]


def decisions(gw: Gateway) -> list[dict[str, Any]]:
    return [r for r in audit_records(gw.settings) if r["type"] == "approval.decided"]


def url(approval_id: str) -> str:
    return f"/v1/approvals/{approval_id}/decision"


async def post(client: TestClient, approval_id: str, body: str, headers: dict[str, str]) -> Any:
    resp = await client.post(url(approval_id), data=body, headers=headers)
    return resp.status, await resp.json()


async def test_a_callback_decides_the_approval_it_names_and_returns_no_token(start: Any) -> None:
    gw, client = await start(EXECGATE_APPROVALS_RUN_HELD="false")
    a = await held_for(gw, client)
    b = await held_for(gw, client)
    c = await held_for(gw, client, tenant="globex")
    approve_a = {"approval_id": a["approval_id"], "decision": "approve", "approver": "carol"}
    body, headers = signed_callback(approve_a, "msg_a")

    # Captured, then replayed to other approvals' URLs within the tolerance window.
    for other, tenant in ((b, "acme"), (c, "globex")):
        status, answer = await post(client, other["approval_id"], body, headers)
        assert status == 403 and answer["error"]["reason"] == "other_approval", answer
        assert "approval_token" not in json.dumps(answer)
        assert await status_of(gw, client, other["approval_id"], tenant) == "pending"
    # The body shape before approval ids were bound is refused, not guessed at.
    legacy, legacy_headers = signed_callback({"decision": "approve"}, "msg_legacy")
    status, answer = await post(client, b["approval_id"], legacy, legacy_headers)
    assert status == 400 and answer["error"]["fields"][0]["field"] == "approval_id", answer

    status, answer = await post(client, a["approval_id"], body, headers)
    assert status == 200 and answer["status"] == "approved", answer
    assert answer["approver"] == "carol" and answer["duplicate"] is False
    # No token, and not the held code either: the callback path hands out nothing.
    assert "approval_token" not in answer and "code" not in answer
    assert [d["approval_id"] for d in decisions(gw)] == [a["approval_id"]]
    assert decisions(gw)[0]["via"] == "callback" and decisions(gw)[0]["webhook_id"] == "msg_a"
    assert refusals(gw) == ["other_approval", "other_approval", "approval_id_missing"]

    # The requester (and only they) fetches the token, and it redeems the request once.
    approver_view = await (
        await client.get(f"/v1/approvals/{a['approval_id']}", headers=gw.approver())
    ).json()
    assert "approval_token" not in approver_view
    mine = await (
        await client.get(f"/v1/approvals/{a['approval_id']}", headers=auth(gw.token()))
    ).json()
    tokens = [mine["approval_token"]]
    tokens.append(
        (
            await (
                await client.get(f"/v1/approvals/{a['approval_id']}", headers=auth(gw.token()))
            ).json()
        )["approval_token"]
    )

    async def present(token: str) -> tuple[int, Any]:
        resp = await client.post(
            "/v1/executions", json=dict(NATIVE, approval_token=token), headers=auth(gw.token())
        )
        return resp.status, await resp.json()

    # Two tokens of one approval, presented at once: still one execution.
    answers = sorted(await asyncio.gather(*(present(t) for t in tokens)), key=lambda a: a[0])
    assert answers[0][0] == 200 and answers[0][1]["stdout"] == "4\n", answers
    assert answers[1][0] == 403 and answers[1][1]["error"]["reason"] == "reused", answers


async def test_a_callback_acts_once(start: Any) -> None:
    gw, client = await start()
    a = await held_for(gw, client)
    b = await held_for(gw, client)
    deny_a = {"approval_id": a["approval_id"], "decision": "deny", "approver": "carol"}
    body, headers = signed_callback(deny_a, "msg_once")
    status, first = await post(client, a["approval_id"], body, headers)
    assert status == 200 and first["status"] == "denied", first

    # The same message again (a sender's retry or a replay): answered, never acted on.
    status, again = await post(client, a["approval_id"], body, headers)
    assert status == 200 and again["duplicate"] is True and again["status"] == "denied", again
    assert len(decisions(gw)) == 1

    # Its id again with another body, even one signed properly, is refused.
    for changed in (
        {**deny_a, "decision": "approve"},
        {**deny_a, "reason": "second thoughts"},
        {"approval_id": b["approval_id"], "decision": "approve", "approver": "carol"},
    ):
        other_body, other_headers = signed_callback(changed, "msg_once")
        status, answer = await post(client, str(changed["approval_id"]), other_body, other_headers)
        assert status == 409 and answer["error"]["reason"] == "webhook_id_reused", answer
    assert await status_of(gw, client, b["approval_id"], "acme") == "pending"
    assert len(decisions(gw)) == 1
    assert refusals(gw) == ["webhook_id_reused"] * 3
    duplicates = [
        r for r in audit_records(gw.settings) if r["type"] == "approval.callback_duplicate"
    ]
    assert [(r["approval_id"], r["webhook_id"]) for r in duplicates] == [
        (a["approval_id"], "msg_once")
    ]


async def test_stale_tampered_and_unsigned_callbacks_are_refused(start: Any) -> None:
    gw, client = await start()
    a = await held_for(gw, client)
    approve = {"approval_id": a["approval_id"], "decision": "approve", "approver": "carol"}
    tolerance = gw.settings.approvals.callback_tolerance_s
    stale_at = datetime.now(UTC) - timedelta(seconds=tolerance + 30)
    early_at = datetime.now(UTC) + timedelta(seconds=tolerance + 30)
    body, headers = signed_callback(approve, "msg_t")
    cases = [
        ("stale_timestamp", *signed_callback(approve, "msg_stale", at=stale_at)),
        ("stale_timestamp", *signed_callback(approve, "msg_early", at=early_at)),
        ("bad_signature", body.replace("carol", "carla"), headers),  # body tampered
        ("bad_signature", body, {**headers, "webhook-id": "msg_other"}),  # id swapped
        ("missing_headers", body, {k: v for k, v in headers.items() if k != "webhook-id"}),
        ("bad_timestamp", body, {**headers, "webhook-timestamp": "soon"}),
    ]
    for reason, sent, sent_headers in cases:
        status, answer = await post(client, a["approval_id"], sent, sent_headers)
        assert status == 401 and answer["error"]["reason"] == reason, (reason, answer)
    assert await status_of(gw, client, a["approval_id"], "acme") == "pending"
    assert refusals(gw) == [reason for reason, _, _ in cases]
    # None of them spent the genuine message's id: it still decides.
    status, answer = await post(client, a["approval_id"], body, headers)
    assert status == 200 and answer["status"] == "approved", answer
