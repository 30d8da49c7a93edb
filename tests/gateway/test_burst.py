"""A burst at a freshly started gateway: every healthy request is served, none fails closed.

Issue 15's burst: many print(i) executions at once against a gateway that has
just started (default configuration, the tenant's limits raised), over real
HTTP, on real nsjail. While the CPUs are busy with sandboxes the policy engine
must keep up: no request may get a 5xx (a `policy_unavailable` from decisions
queueing behind an engine thread was the failure), and each request leaves
exactly one execution in the audit log. Counts, not timings.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.app import create_app
from tests.gateway.conftest import audit_records, auth, make_settings, require_root

pytestmark = pytest.mark.integration

CONCURRENCY = 64
REQUESTS = 2 * CONCURRENCY


async def test_burst_at_a_fresh_gateway_gets_no_5xx(tmp_path: Path, aiohttp_client: Any) -> None:
    require_root()
    settings = make_settings(
        tmp_path,
        EXECGATE_TENANTS_ACME_MAX_CONCURRENT=str(CONCURRENCY),
        EXECGATE_TENANTS_ACME_RATE_PER_S="10000",
        EXECGATE_TENANTS_ACME_BURST=str(REQUESTS),
    )
    assert settings.policy.engine == "embedded"  # the default engine is the one under test
    client = await aiohttp_client(create_app(settings))
    from gateway.auth.keys import load_or_create_dev_secret
    from gateway.auth.tokens import mint_token

    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    token = mint_token(secret, tenant="acme", sub="burst", scopes=["exec:python"], ttl_s=600)
    headers = auth(token)
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> tuple[int, str, str | None]:
        async with gate:
            resp = await client.post(
                "/v1/executions",
                json={"language": "python", "code": f"print({i})"},
                headers=headers,
            )
            body = await resp.json()
        code = body.get("error", {}).get("code", "") if resp.status != 200 else ""
        # A program starved of CPU past its own deadline is a result (status "timeout"),
        # not a gateway failure: only what ran to completion must have printed.
        out = body.get("stdout", "") if body.get("status") == "ok" else None
        return resp.status, code, out

    results = await asyncio.gather(*(one(i) for i in range(REQUESTS)))
    statuses = Counter(status for status, _, _ in results)
    failed = Counter(code for status, code, _ in results if status >= 500)
    assert not failed, f"5xx under the burst: {dict(failed)}; all statuses {dict(statuses)}"
    assert statuses == {200: REQUESTS}, dict(statuses)
    printed = [(i, out) for i, (_, _, out) in enumerate(results) if out is not None]
    assert printed and all(out == f"{i}\n" for i, out in printed), printed
    records = audit_records(settings)
    finished = [r for r in records if r["type"] == "execution.finished"]
    started = [r for r in records if r["type"] == "execution.started"]
    assert len(finished) == len(started) == REQUESTS
    assert len({r["execution_id"] for r in finished}) == REQUESTS
    assert not [r for r in records if r["type"] == "request.rejected"]
