"""The review stage end to end: a real gateway on real nsjail with the host tracer
on, the shipped policy's review in the embedded engine, the answer and the audit log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from backends.capture.host import TracerHub
from tests.gateway.conftest import CAPTURE_ON, audit_records, auth, make_settings, require_root

pytestmark = pytest.mark.integration

TRIES = (
    "cat /etc/shadow 2>/dev/null\n"
    "cat ~/.ssh/id_rsa 2>/dev/null\n"
    "mount -t tmpfs none /tmp 2>/dev/null\n"
    "echo done\n"
)


async def test_what_the_code_tried_is_in_the_answer_the_log_and_the_review(
    aiohttp_client: Any, tmp_path: Path, tracer_hub: TracerHub
) -> None:
    require_root()
    from gateway.app import create_app
    from gateway.auth.keys import load_or_create_dev_secret
    from gateway.auth.tokens import mint_token

    settings = make_settings(tmp_path, **CAPTURE_ON)
    client: TestClient = await aiohttp_client(create_app(settings, tracers=tracer_hub))
    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    token: Callable[..., str] = lambda scopes="exec:bash": mint_token(  # noqa: E731
        secret, tenant="acme", sub="agent-7", scopes=scopes.split(), ttl_s=600
    )
    plain = await client.post(
        "/v1/executions", json={"language": "bash", "code": "echo 1"}, headers=auth(token())
    )
    body = await plain.json()
    assert plain.status == 200, body
    assert body["behaviour"]["capture"] == "on", body["behaviour"]
    assert body["behaviour"]["files"] == [] and body["behaviour"]["flags"] == []

    resp = await client.post(
        "/v1/executions", json={"language": "bash", "code": TRIES}, headers=auth(token())
    )
    body = await resp.json()
    assert resp.status == 200 and body["stdout"] == "done\n", body
    behaviour = body["behaviour"]
    paths = {f["path"] for f in behaviour["files"]}
    assert "/etc/shadow" in paths and any(p.endswith("/.ssh/id_rsa") for p in paths), behaviour
    assert any(p["path"].endswith("/mount") for p in behaviour["programs"]), behaviour
    assert "mount" in behaviour["syscalls_refused"], behaviour
    rules = [f["rule"] for f in behaviour["flags"]]
    assert "credential_path" in rules and "privileged_syscall" in rules, behaviour["flags"]
    assert behaviour["flags"][0]["severity"] == "high"

    records = [r for r in audit_records(settings) if r.get("execution_id") == body["execution_id"]]
    types = [r["type"] for r in records]
    # Durable before the answer, in this order.
    assert types.index("execution.finished") < types.index("execution.behaviour")
    assert types.index("execution.behaviour") < types.index("execution.review")
    review = next(r for r in records if r["type"] == "execution.review")
    assert [f["rule"] for f in review["flags"]] == rules

    reader = token("audit:read")
    flagged = await (await client.get("/v1/audit?flagged=true", headers=auth(reader))).json()
    assert [r["execution_id"] for r in flagged["records"]] == [body["execution_id"]]
    stored = await (
        await client.get(f"/v1/executions/{body['execution_id']}", headers=auth(token()))
    ).json()
    assert stored["result"]["behaviour"]["flags"] == behaviour["flags"]
