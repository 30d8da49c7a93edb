"""The review webhook over real HTTP: signed (checked by the reference Standard
Webhooks library), retried on 5xx, final on 4xx, bounded when the receiver is dead."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from standardwebhooks.webhooks import Webhook

from gateway.audit.log import AuditLog
from gateway.review.document import Flag, parse_flags
from gateway.review.notifier import ReviewNotifier
from gateway.settings.model import ReviewSettings
from tests.waiting import until

SECRET = "whsec_" + base64.b64encode(b"r" * 32).decode()
FLAG = Flag("credential_path", "high", "open /etc/shadow: EACCES")


class Receiver:
    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.got: list[tuple[dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.got.append((dict(request.headers), await request.read()))
        status = self.statuses.pop(0) if self.statuses else 204
        return web.Response(status=status)


@pytest.fixture
async def audit(tmp_path: Path) -> AsyncIterator[AuditLog]:
    log = AuditLog(tmp_path / "audit.jsonl")
    await log.start()
    yield log
    await log.close()


async def serve(receiver: Receiver) -> TestServer:
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


def delivered(audit: AuditLog) -> list[dict[str, Any]]:
    lines = Path(audit.path).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "review.delivered"]


async def test_signed_retried_on_5xx_and_audited(tmp_path: Path, audit: AuditLog) -> None:
    receiver = Receiver([503, 500])
    server = await serve(receiver)
    (tmp_path / "secret").write_text(SECRET)
    settings = ReviewSettings(
        webhook_url=str(server.make_url("/hook")), webhook_secret_file=str(tmp_path / "secret"),
        backoff_initial_s=0.01, backoff_max_s=0.02, public_url="https://gw.example",
    )  # fmt: skip
    notifier = ReviewNotifier(settings, audit)
    await notifier.start()
    try:
        await notifier.notify("exe_1", "acme", "nsjail", [FLAG])
        await until(lambda: len(delivered(audit)) == 3, what="three attempts audited")
    finally:
        await notifier.close()
        await server.close()
    headers, body = receiver.got[-1]
    payload = Webhook(SECRET).verify(body, headers)
    assert payload["type"] == "execution.flagged"
    assert payload["data"]["flags"] == [FLAG.as_dict()]
    assert payload["data"]["story"] == "https://gw.example/console/executions/exe_1"
    assert {h["webhook-id"] for h, _ in receiver.got} == {receiver.got[0][0]["webhook-id"]}
    attempts = delivered(audit)
    assert [(a["status_code"], a["delivered"], a["final"]) for a in attempts] == [
        (503, False, False), (500, False, False), (204, True, True),
    ]  # fmt: skip
    assert all(a["execution_id"] == "exe_1" and a["tenant"] == "acme" for a in attempts)


async def test_a_4xx_is_final_and_a_dead_receiver_costs_bounded_memory(
    audit: AuditLog,
) -> None:
    receiver = Receiver([400])
    server = await serve(receiver)
    notifier = ReviewNotifier(ReviewSettings(webhook_url=str(server.make_url("/hook"))), audit)
    await notifier.start()
    await notifier.notify("exe_1", "acme", "nsjail", [FLAG])
    await until(lambda: len(delivered(audit)) == 1, what="the refused delivery audited")
    await notifier.close()
    await server.close()
    assert delivered(audit)[0]["final"] is True and delivered(audit)[0]["status_code"] == 400

    # Nobody listens: deliveries queue up to max_pending, the rest are dropped (audited).
    dead = ReviewSettings(
        webhook_url="http://127.0.0.1:9/hook", max_pending=2, delivery_attempts=20,
        backoff_initial_s=30, backoff_max_s=60,
    )  # fmt: skip
    notifier = ReviewNotifier(dead, audit)
    await notifier.start()
    try:
        for n in range(6):
            await notifier.notify(f"exe_{n}", "acme", "nsjail", [FLAG])
        dropped = [r for r in delivered(audit) if "dropped" in r.get("error", "")]
        assert len(dropped) >= 3
    finally:
        await notifier.close()


async def test_nothing_is_sent_without_a_url_or_without_flags(audit: AuditLog) -> None:
    notifier = ReviewNotifier(ReviewSettings(), audit)
    await notifier.start()
    await notifier.notify("exe_1", "acme", "nsjail", [FLAG])
    await asyncio.sleep(0)
    await notifier.close()
    assert delivered(audit) == []


def test_flags_are_read_defensively() -> None:
    assert parse_flags(None) == ([], "")
    assert parse_flags({"flags": "x"})[1] == "data.execgate.review.flags is not an array"
    many = {"flags": [{"rule": f"r{i}", "severity": "low"} for i in range(100)]}
    flags, problem = parse_flags(many)
    assert len(flags) == 64 and "36 flags beyond 64" in problem
    long = parse_flags({"flags": [{"rule": "r", "detail": "x" * 5000}]})[0][0]
    assert len(long.detail) <= 300 and long.severity == "medium"
