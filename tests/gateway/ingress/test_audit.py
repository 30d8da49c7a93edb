"""GET /v1/audit against a real gateway and its real audit log."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestClient

from tests.gateway.conftest import auth

pytestmark = pytest.mark.integration


async def test_audit_read_is_scoped_to_the_tenant(
    client: TestClient, token: Callable[..., str]
) -> None:
    run = await client.post(
        "/v1/executions", json={"language": "python", "code": "print(1)"}, headers=auth(token())
    )
    execution_id = (await run.json())["execution_id"]
    await client.post(
        "/v1/executions",
        json={"language": "python", "code": "print(2)"},
        headers=auth(token(tenant="globex")),
    )

    reader = token(scopes="audit:read")
    resp = await client.get(f"/v1/audit?execution_id={execution_id}", headers=auth(reader))
    body = await resp.json()
    assert resp.status == 200, body
    assert [r["type"] for r in body["records"]] == [
        "policy.decided",
        "execution.started",
        "execution.finished",
    ]
    mine = await (await client.get("/v1/audit", headers=auth(reader))).json()
    assert {r["tenant"] for r in mine["records"]} == {"acme"}

    other = await client.get("/v1/audit?tenant=globex", headers=auth(reader))
    assert other.status == 403
    everyone = await client.get(
        "/v1/audit?tenant=globex", headers=auth(token(scopes="audit:read:all"))
    )
    assert {r["tenant"] for r in (await everyone.json())["records"]} == {"globex"}

    page = await (await client.get("/v1/audit?limit=1", headers=auth(reader))).json()
    assert len(page["records"]) == 1 and page["next_after_seq"] == page["records"][0]["seq"]


async def test_audit_needs_the_scope_and_valid_filters(
    client: TestClient, token: Callable[..., str]
) -> None:
    assert (await client.get("/v1/audit", headers=auth(token()))).status == 403
    assert (await client.get("/v1/audit")).status == 401
    bad = await client.get("/v1/audit?since=yesterday", headers=auth(token(scopes="audit:read")))
    assert bad.status == 400 and (await bad.json())["error"]["fields"][0]["field"] == "since"
    bad = await client.get("/v1/audit?limit=-1", headers=auth(token(scopes="audit:read")))
    assert bad.status == 400


async def test_audit_newest_first_pages_back_with_before(
    client: TestClient, token: Callable[..., str]
) -> None:
    reader = auth(token(scopes="audit:read:all"))
    for code in ("print(1)", "print(2)"):
        await client.post(
            "/v1/executions", json={"language": "python", "code": code}, headers=auth(token())
        )
    everything = await (await client.get("/v1/audit?limit=1000", headers=reader)).json()
    seqs = [r["seq"] for r in everything["records"]]
    first = await (await client.get("/v1/audit?order=desc&limit=3", headers=reader)).json()
    assert [r["seq"] for r in first["records"]] == seqs[::-1][:3]
    cursor = first["next_before"]
    assert cursor == seqs[-3] and "next_after_seq" not in first
    older = await client.get(f"/v1/audit?order=desc&limit=3&before={cursor}", headers=reader)
    assert [r["seq"] for r in (await older.json())["records"]] == seqs[::-1][3:6]
    for bad in ("order=up", "before=3", "order=desc&before=x"):
        resp = await client.get(f"/v1/audit?{bad}", headers=reader)
        assert resp.status == 400, bad


@pytest.mark.parametrize(
    ("query", "field"),
    [("flagged=yes", "flagged"), ("severity=urgent", "severity"), ("attempt=dns", "attempt")],
)
async def test_behaviour_filters_are_checked(
    client: TestClient, token: Callable[..., str], query: str, field: str
) -> None:
    bad = await client.get(f"/v1/audit?{query}", headers=auth(token(scopes="audit:read")))
    assert bad.status == 400 and (await bad.json())["error"]["fields"][0]["field"] == field
    good = await client.get(
        "/v1/audit?flagged=true&severity=high&attempt=files",
        headers=auth(token(scopes="audit:read")),
    )
    assert good.status == 200 and (await good.json())["records"] == []
