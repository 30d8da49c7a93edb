"""The console in a real browser (headless Chromium) against a real gateway on loopback:
sign in, approve a held execution and read its story, deny one, see nothing without
the scope, and a cross-site page that cannot decide anything."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from gateway.appkeys import SERVICES
from tests.gateway.conftest import auth
from tests.gateway.console.browser import Browser, chromium
from tests.gateway.console.conftest import HOSTILE, hold

pytestmark = pytest.mark.integration

QUICK = {"language": "python", "code": "print(1)"}
APPROVER = "approvals:read approvals:decide audit:read:all"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as b:
        yield b


async def sign_in(browser: Browser, gateway: TestClient, token: str) -> None:
    page = browser.page
    await page.goto(str(gateway.make_url("/console/")))
    assert page.url.endswith("/console/signin")
    await page.fill("textarea[name=token]", token)
    await page.click("form.signin button[type=submit]")
    await page.wait_for_load_state()


async def approval_state(gateway: TestClient, token: Callable[..., str], approval_id: str) -> str:
    headers = auth(token(sub="auditor", scopes="approvals:read"))
    resp = await gateway.get(f"/v1/approvals/{approval_id}", headers=headers)
    return str((await resp.json())["status"])


async def test_approve_a_held_execution_and_read_its_story(
    gateway: TestClient, token: Callable[..., str], browser: Browser
) -> None:
    held = await hold(gateway, token)
    page = browser.page
    await browser.shot("signin")
    await sign_in(browser, gateway, token(sub="bob", scopes=APPROVER))
    assert page.url.endswith("/console/approvals")

    card = page.locator(f"article#{held['approval_id']}")
    await card.wait_for()
    text = await card.inner_text()
    assert "agent-7" in text and "acme" in text and "ctypes" in text
    assert "left" in await card.locator(".countdown").inner_text()
    # Highlighted: the keyword is its own span inside the code block.
    assert await card.locator("pre.code span.kn", has_text="import").count() == 1
    await browser.shot("approvals")

    await card.locator("textarea[name=reason]").fill("reviewed: harmless sizeof")
    await card.locator("button[value=approve]").click()
    await page.wait_for_load_state()
    assert "Decision recorded" in await page.locator(".notice").inner_text()

    requester = auth(token(sub="agent-7"))
    resp = await gateway.get(f"/v1/executions/{held['execution_id']}?wait=20", headers=requester)
    assert (await resp.json())["status"] == "done"

    await page.goto(str(gateway.make_url(f"/console/executions/{held['execution_id']}")))
    story = await page.locator("main").inner_text()
    for expected in ("approval.requested", "policy.decided", "approval.decided", "ran 4"):
        assert expected in story, expected
    assert "reviewed: harmless sizeof" in story
    assert "import" in await page.locator("section.request pre.code").inner_text()
    assert "chain intact" in await page.locator(".chain").inner_text()
    await browser.shot("execution-story")
    await page.locator(".timeline").scroll_into_view_if_needed()
    await browser.shot("execution-story-timeline", full_page=False)

    await page.goto(str(gateway.make_url("/console/audit?type=approval.decided")))
    rows = page.locator("table.audit tbody tr")
    assert await rows.count() == 1
    assert "bob" in await rows.first.inner_text()
    await page.goto(str(gateway.make_url("/console/audit")))
    await browser.shot("audit")

    # Something for each health table: a refusal by admission, a self-test's record.
    globex = auth(token(tenant="globex", sub="g-1", scopes="exec:python"))
    statuses = [
        (await gateway.post("/v1/executions", json=QUICK, headers=globex)).status for _ in range(2)
    ]
    assert statuses == [200, 429]
    await gateway.server.app[SERVICES].audit.append(
        "sandbox.selftest",
        backend="nsjail",
        counts={"contained": 80, "escaped": 0, "not_applicable": 4},
        escaped=[],
        duration_ms=5400,
        out_of_service=False,
    )
    await page.goto(str(gateway.make_url("/console/health")))
    refusals = await page.locator("section", has_text="Admission refusals").inner_text()
    assert "globex" in refusals
    assert "80" in await page.locator("table.selftest").inner_text()
    assert "ready" in await page.locator(".overall").inner_text()
    assert await page.locator("table.readiness").inner_text()
    # console.js drew a chart from the table the server rendered.
    await page.locator("svg.chart rect.bar").first.wait_for()
    await browser.shot("health")
    assert browser.csp_violations() == [], browser.messages


async def test_deny_with_a_reason(
    gateway: TestClient, token: Callable[..., str], browser: Browser
) -> None:
    held = await hold(gateway, token, HOSTILE)
    page = browser.page
    dialogs: list[str] = []
    page.on("dialog", lambda d: dialogs.append(d.message))
    await sign_in(browser, gateway, token(sub="bob", scopes=APPROVER))
    card = page.locator(f"article#{held['approval_id']}")
    assert "<script>alert(1)</script>" in await card.locator("pre.code").inner_text()
    # Denying without a reason is stopped in the page; nothing is sent.
    await card.locator("button[value=deny]").click()
    assert await approval_state(gateway, token, held["approval_id"]) == "pending"
    await card.locator("textarea[name=reason]").fill("no native code in this tenant")
    await card.locator("button[value=deny]").click()
    await page.wait_for_load_state()
    assert "denied" in await page.locator(".notice").inner_text()
    assert await approval_state(gateway, token, held["approval_id"]) == "denied"
    recent = await page.locator("table.recent").inner_text()
    assert "no native code in this tenant" in recent
    await page.goto(str(gateway.make_url(f"/console/executions/{held['execution_id']}")))
    assert "approval_denied" in await page.locator("main").inner_text()
    assert dialogs == []  # the hostile code was shown, never run
    assert browser.csp_violations() == [], browser.messages


async def test_without_the_scope_the_page_shows_nothing(
    gateway: TestClient, token: Callable[..., str], browser: Browser
) -> None:
    held = await hold(gateway, token)
    page = browser.page
    await sign_in(browser, gateway, token(sub="carol", scopes="audit:read"))
    resp = await page.goto(str(gateway.make_url("/console/approvals")))
    assert resp is not None and resp.status == 403
    content = await page.content()
    assert held["approval_id"] not in content and "ctypes" not in content
    assert "Approvals" not in await page.locator("header nav").inner_text()
    await browser.shot("forbidden")
    # A token with no console scope at all gets no session.
    await page.context.clear_cookies()
    await sign_in(browser, gateway, token(sub="mallory", scopes="exec:python"))
    assert "no console scope" in await page.locator(".error").inner_text()
    assert await page.context.cookies() == []


async def test_csp_header_and_a_cross_site_page_cannot_decide(
    gateway: TestClient,
    token: Callable[..., str],
    browser: Browser,
    aiohttp_server: Any,
) -> None:
    held = await hold(gateway, token)
    page = browser.page
    await sign_in(browser, gateway, token(sub="bob", scopes=APPROVER))
    resp = await page.goto(str(gateway.make_url("/console/approvals")))
    assert resp is not None
    csp = (await resp.all_headers())["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp

    # Our own page's script, without the form's token: refused.
    status = await page.evaluate(
        """async (url) => (await fetch(url, {method: "POST",
               body: new URLSearchParams({decision: "approve", reason: "x"})})).status""",
        f"/console/approvals/{held['approval_id']}/decision",
    )
    assert status == 403

    # An attacker's page on another origin (localhost vs 127.0.0.1) auto-posts a decision.
    target = str(gateway.make_url(f"/console/approvals/{held['approval_id']}/decision"))
    evil = (
        f'<form id="f" method="post" action="{target}">'
        '<input name="decision" value="approve"><input name="reason" value="pwned"></form>'
        "<script>document.getElementById('f').submit()</script>"
    )

    async def attacker(request: web.Request) -> web.Response:
        return web.Response(text=evil, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", attacker)
    server = await aiohttp_server(app, host="127.0.0.1")
    await page.goto(f"http://localhost:{server.port}/")
    await page.wait_for_load_state()
    assert await approval_state(gateway, token, held["approval_id"]) == "pending"


async def test_a_running_execution_shows_its_output_live(
    gateway: TestClient, token: Callable[..., str], browser: Browser
) -> None:
    slow = {
        "language": "python",
        "code": "import time\nprint('first <b>not bold</b>', flush=True)\ntime.sleep(6)\n"
        "print('second')\n",
        "limits": {"timeout_s": 30},
    }
    requester = auth(token(sub="agent-7"))
    run = asyncio.ensure_future(gateway.post("/v1/executions", json=slow, headers=requester))
    svc = gateway.server.app[SERVICES]

    async def running_id() -> str:
        while True:
            if svc.live.running:
                return next(iter(svc.live.running))
            await asyncio.sleep(0.05)

    execution_id = await asyncio.wait_for(running_id(), 60)
    await sign_in(browser, gateway, token(sub="bob", scopes=APPROVER))
    page = browser.page
    await page.goto(str(gateway.make_url(f"/console/executions/{execution_id}")))
    live = page.locator("pre#live-output")
    await live.locator("span.stdout", has_text="first").wait_for()
    # Shown while it runs: the gateway still has it among the running executions.
    assert execution_id in svc.live.running
    assert await live.locator("b").count() == 0  # printed text, never markup
    await browser.shot("execution-live")
    # When it ends, the page reloads with the result.
    await page.locator("section.result").wait_for(timeout=60_000)
    assert "second" in await page.locator("section.result").inner_text()
    assert (await (await run).json())["stdout"] == "first <b>not bold</b>\nsecond\n"
    assert browser.csp_violations() == [], browser.messages
