"""The console over plain HTTP against a real gateway: cookies, scopes, CSRF, headers."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestClient

from gateway.appkeys import SERVICES
from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records, auth
from tests.gateway.console.conftest import HOSTILE, hold, origin, sign_in
from tests.waiting import until

pytestmark = pytest.mark.integration

APPROVER = "approvals:read approvals:decide"
INLINE_HANDLER = re.compile(r"<[^>]*\son[a-z]+=", re.IGNORECASE)


async def test_sign_in_sets_a_strict_short_cookie_and_keeps_no_token(
    gateway: TestClient, token: Callable[..., str], settings: Settings
) -> None:
    tok = token(sub="bob", scopes=APPROVER)
    resp = await gateway.post(
        "/console/signin", data={"token": tok}, headers=origin(gateway), allow_redirects=False
    )
    assert resp.status == 303
    cookie = resp.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console/" in cookie
    max_age = int(cookie.split("Max-Age=")[1].split(";")[0])
    assert 0 < max_age <= 1800
    assert tok not in cookie
    page = await gateway.get("/console/approvals")
    assert page.status == 200
    assert "Content-Security-Policy" in page.headers
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Referrer-Policy"] == "same-origin"
    signed_in = [r for r in audit_records(settings) if r["type"] == "console.signed_in"]
    assert signed_in[-1]["subject"] == "bob"
    assert tok not in (await page.text())
    assert all(tok not in str(r) for r in audit_records(settings))


async def test_sign_in_refusals(gateway: TestClient, token: Callable[..., str]) -> None:
    good = token(sub="bob", scopes=APPROVER)
    # Login CSRF: a form posted from another site does not sign anybody in.
    for headers in ({}, {"Origin": "http://evil.example"}):
        resp = await gateway.post("/console/signin", data={"token": good}, headers=headers)
        assert resp.status == 403
        assert "Set-Cookie" not in resp.headers
    resp = await gateway.post(
        "/console/signin", data={"token": good + "x"}, headers=origin(gateway)
    )
    assert resp.status == 401 and "bad_signature" in await resp.text()
    resp = await gateway.post(
        "/console/signin", data={"token": token(scopes="exec:python")}, headers=origin(gateway)
    )
    assert resp.status == 403 and "Set-Cookie" not in resp.headers
    # Without a session every page sends the browser to sign in.
    for path in ("/console/approvals", "/console/audit", "/console/health", "/console/"):
        resp = await gateway.get(path, allow_redirects=False)
        assert resp.status == 303 and resp.headers["Location"] == "/console/signin"


async def test_a_user_without_the_scope_sees_nothing(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    held = await hold(gateway, token)
    await sign_in(gateway, token(sub="carol", scopes="audit:read"))
    resp = await gateway.get("/console/approvals")
    text = await resp.text()
    assert resp.status == 403
    assert held["approval_id"] not in text and "ctypes" not in text
    assert "Content-Security-Policy" in resp.headers

    other = await gateway.get("/console/audit")
    assert other.status == 200  # audit:read opens the audit trail...
    story = await (await gateway.get(f"/console/executions/{held['execution_id']}")).text()
    assert "approval.requested" in story and 'class="card request"' not in story  # not the code
    await gateway.post("/console/signout", data={"csrf": ""}, headers=origin(gateway))
    await sign_in(gateway, token(sub="dan", scopes="approvals:read"))
    for path in (
        "/console/audit",
        "/console/health",
        f"/console/executions/{held['execution_id']}",
    ):
        resp = await gateway.get(path)
        text = await resp.text()
        assert resp.status == 403, path  # ...approvals:read does not
        assert held["execution_id"] not in text and "policy.decided" not in text


async def test_decisions_need_the_csrf_token_and_our_origin(
    gateway: TestClient, token: Callable[..., str], settings: Settings
) -> None:
    held = await hold(gateway, token)
    csrf = await sign_in(gateway, token(sub="bob", scopes=APPROVER))
    url = f"/console/approvals/{held['approval_id']}/decision"
    form = {"decision": "approve", "reason": "fine"}
    attempts = [
        (form, origin(gateway)),  # no token
        ({**form, "csrf": csrf[:-2]}, origin(gateway)),  # wrong token
        ({**form, "csrf": csrf}, {"Origin": "http://evil.example"}),  # right token, other site
        ({**form, "csrf": csrf}, {}),  # no Origin, no Referer
    ]
    for data, headers in attempts:
        resp = await gateway.post(url, data=data, headers=headers, allow_redirects=False)
        assert resp.status == 403, (data, headers)
    approver = auth(token(sub="bob", scopes=APPROVER))
    state = await (
        await gateway.get(f"/v1/approvals/{held['approval_id']}", headers=approver)
    ).json()
    assert state["status"] == "pending"

    resp = await gateway.post(
        url, data={**form, "csrf": csrf}, headers=origin(gateway), allow_redirects=False
    )
    assert resp.status == 303

    async def state_now() -> dict[str, object]:
        url = f"/v1/approvals/{held['approval_id']}"
        return await (await gateway.get(url, headers=approver)).json()  # type: ignore[no-any-return]

    # Approved, then run by the desk: the state ends at executed, by bob's decision.
    async def executed() -> bool:
        return (await state_now())["status"] == "executed"

    await until(executed, what="the approved execution ran")
    assert (await state_now())["approver"] == "bob"
    decided = [r for r in audit_records(settings) if r["type"] == "approval.decided"]
    assert decided[-1]["via"] == "console" and decided[-1]["approver"] == "bob"


async def test_the_desk_rules_hold_in_the_console(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    held = await hold(gateway, token)
    url = f"/console/approvals/{held['approval_id']}/decision"
    # The requester cannot approve their own request, even with the scope.
    csrf = await sign_in(gateway, token(sub="agent-7", scopes=APPROVER))
    resp = await gateway.post(
        url, data={"decision": "approve", "csrf": csrf}, headers=origin(gateway)
    )
    assert resp.status == 403 and "own request" in await resp.text()
    # approvals:read alone shows the queue but cannot decide.
    await gateway.post("/console/signout", data={"csrf": csrf}, headers=origin(gateway))
    csrf = await sign_in(gateway, token(sub="erin", scopes="approvals:read"))
    page = await (await gateway.get("/console/approvals")).text()
    assert held["approval_id"] in page and "cannot decide" in page
    resp = await gateway.post(
        url, data={"decision": "approve", "csrf": csrf}, headers=origin(gateway)
    )
    assert resp.status == 403
    # Another tenant's approver does not even learn it exists.
    await gateway.post("/console/signout", data={"csrf": csrf}, headers=origin(gateway))
    csrf = await sign_in(gateway, token(tenant="globex", sub="frank", scopes=APPROVER))
    page = await (await gateway.get("/console/approvals")).text()
    assert held["approval_id"] not in page
    resp = await gateway.post(
        url, data={"decision": "approve", "csrf": csrf}, headers=origin(gateway)
    )
    assert resp.status == 404


async def test_sign_out_ends_the_session(gateway: TestClient, token: Callable[..., str]) -> None:
    csrf = await sign_in(gateway, token(sub="bob", scopes=APPROVER))
    cookie = gateway.session.cookie_jar.filter_cookies(gateway.make_url("/console/"))
    stolen = {"execgate_console": cookie["execgate_console"].value}
    resp = await gateway.post("/console/signout", data={"csrf": csrf}, headers=origin(gateway))
    assert resp.status == 200  # followed to the sign-in page
    # The old cookie value is worthless once signed out.
    gateway.session.cookie_jar.update_cookies(stolen, gateway.make_url("/console/"))
    resp = await gateway.get("/console/approvals", allow_redirects=False)
    assert resp.status == 303


async def test_static_assets_and_no_inline_code(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    css = await gateway.get("/console/static/console.css")
    js = await gateway.get("/console/static/console.js")
    assert css.status == 200 and css.content_type == "text/css"
    assert js.status == 200 and js.content_type == "text/javascript"
    assert (await gateway.get("/console/static/../session.py")).status == 404
    await hold(gateway, token)
    await sign_in(gateway, token(sub="bob", scopes=f"{APPROVER} audit:read"))
    for path in ("/console/approvals", "/console/audit", "/console/health"):
        page = await (await gateway.get(path)).text()
        assert "<script>" not in page and "<style" not in page and " style=" not in page
        assert not INLINE_HANDLER.search(page), path


async def test_the_story_shows_any_record_type_and_escapes_everything(
    gateway: TestClient, token: Callable[..., str], settings: Settings
) -> None:
    held = await hold(gateway, token, HOSTILE)
    # Record types the console has never heard of (egress capture, sandbox events...).
    await gateway.server.app[SERVICES].audit.append(
        "network.attempt",
        execution_id=held["execution_id"],
        tenant="acme",
        destination={"host": "<b>evil</b>.example", "port": 443},
        verdict="blocked",
    )
    await sign_in(gateway, token(sub="bob", scopes="approvals:read audit:read"))
    for path in ("/console/approvals", f"/console/executions/{held['execution_id']}"):
        page = await (await gateway.get(path)).text()
        assert "<script>alert" not in page and "<img src=x" not in page and "<b>evil" not in page
    assert "network.attempt" in page and "&lt;b&gt;evil&lt;/b&gt;.example" in page
    assert "approval.requested" in page and "policy.decided" in page

    filtered = await (await gateway.get("/console/audit?type=network.attempt")).text()
    assert filtered.count("<tr><td>") == 1
    future = await (await gateway.get("/console/audit?since=2999-01-01T00:00")).text()
    assert "No records." in future
    past = await (await gateway.get("/console/audit?until=2000-01-01T00:00")).text()
    assert "No records." in past
    bad = await gateway.get("/console/audit?since=yesterday")
    assert bad.status == 400


async def test_audit_read_sees_only_its_own_tenant(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    held = await hold(gateway, token)
    await sign_in(gateway, token(tenant="globex", sub="gina", scopes="audit:read"))
    story = await gateway.get(f"/console/executions/{held['execution_id']}")
    assert story.status == 404 and held["execution_id"] not in await story.text()
    trail = await (await gateway.get("/console/audit")).text()
    assert held["execution_id"] not in trail
    assert (await gateway.get("/console/audit?tenant=acme")).status == 403


async def test_signing_in_again_replaces_the_session(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    url = gateway.make_url("/console/")
    await sign_in(gateway, token(sub="bob", scopes="approvals:read"))
    first = gateway.session.cookie_jar.filter_cookies(url)["execgate_console"].value
    await sign_in(gateway, token(sub="bob2", scopes="audit:read"))
    second = gateway.session.cookie_jar.filter_cookies(url)["execgate_console"].value
    assert first != second
    assert (await gateway.get("/console/audit", allow_redirects=False)).status == 200
    gateway.session.cookie_jar.update_cookies({"execgate_console": first}, url)
    assert (await gateway.get("/console/approvals", allow_redirects=False)).status == 303


async def test_approvers_see_every_input_file_and_stdin_escaped(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    """What will run, all of it: small text files and stdin inline (escaped like the
    code), binary or large files by size and sha256."""
    big = b"x = 1\n" * 4000  # over the inline limit
    blob = bytes(range(256))
    script = b"<script>alert('file')</script>\nimport ctypes\n"
    body = {
        **HOSTILE,
        "stdin": "</pre><img src=x onerror=alert('stdin')>",
        "files": [
            {"path": "helper.py", "content_b64": base64.b64encode(script).decode()},
            {"path": "blob.bin", "content_b64": base64.b64encode(blob).decode()},
            {"path": "big.py", "content_b64": base64.b64encode(big).decode()},
        ],
    }
    held = await hold(gateway, token, body)
    await sign_in(gateway, token(sub="bob", scopes=APPROVER))
    page = await (await gateway.get("/console/approvals")).text()
    assert held["approval_id"] in page
    assert "&lt;script&gt;alert(&#x27;file&#x27;)&lt;/script&gt;" in page
    assert "&lt;/pre&gt;&lt;img src=x onerror=alert(&#x27;stdin&#x27;)&gt;" in page
    assert "<script>alert" not in page and not INLINE_HANDLER.search(page)
    for path, content in (("helper.py", script), ("blob.bin", blob), ("big.py", big)):
        assert path in page and hashlib.sha256(content).hexdigest() in page, path
        assert f"{len(content)} bytes" in page, path
    assert "x = 1\nx = 1" not in page  # the big file by its hash only


async def _tried(gateway: TestClient, execution_id: str, tenant: str = "acme") -> None:
    audit = gateway.server.app[SERVICES].audit
    await audit.append(
        "execution.behaviour", execution_id=execution_id, tenant=tenant, capture="on",
        files=[
            {"op": "create", "path": "/workspace/ok.txt", "result": "ok", "count": 1},
            {"op": "open", "path": "/etc/<b>shadow</b>", "result": "EACCES", "count": 3},
        ],
        programs=[{"path": "/bin/sh", "argv": ["sh", "-c", "<img src=x>"], "result": "ok",
                   "count": 1}],
        signals=[], syscalls_refused={"mount": 2}, dropped=0,
    )  # fmt: skip
    await audit.append(
        "execution.review", execution_id=execution_id, tenant=tenant,
        flags=[{"rule": "credential_path", "severity": "high", "detail": "open /etc/<b>shadow"}],
    )  # fmt: skip
    await audit.append(
        "network.attempt", execution_id=execution_id, tenant=tenant, kind="connect",
        host="10.0.0.1", port=80, verdict="blocked", rule="internal_address",
    )  # fmt: skip


async def test_the_story_shows_what_the_code_tried_flagged_first_and_escaped(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    held = await hold(gateway, token)
    await _tried(gateway, held["execution_id"])
    await sign_in(gateway, token(sub="bob", scopes="audit:read"))
    page = await (await gateway.get(f"/console/executions/{held['execution_id']}")).text()
    assert "What the code tried" in page
    assert "<b>shadow" not in page and "<img src=x" not in page
    assert "&lt;b&gt;shadow" in page
    assert page.index("Flagged by the review") < page.index("<h3>Files")
    # Failed attempts before the ones that succeeded.
    assert page.index("/etc/&lt;b&gt;shadow") < page.index("/workspace/ok.txt")
    assert "Refused system calls" in page and "mount" in page
    assert "10.0.0.1:80" in page


async def test_patterns_count_by_kind_tenant_and_place(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    mine, theirs = await hold(gateway, token), await hold(gateway, token)
    await _tried(gateway, mine["execution_id"])
    await _tried(gateway, theirs["execution_id"], tenant="globex")
    await sign_in(gateway, token(sub="bob", scopes="audit:read"))
    page = await (await gateway.get("/console/patterns")).text()
    assert "Attempts per hour" in page and "globex" not in page
    assert "/etc/&lt;b&gt;shadow" in page and "<b>shadow" not in page
    assert "credential_path (high)" in page and "10.0.0.1:80" in page
    # files 4 (3 + 1), programs 1, syscalls 2, network 1, flags 1: total 9 for acme.
    assert (
        "<td>acme</td><td>4</td><td>1</td><td>0</td><td>2</td><td>1</td><td>1</td><td>9</td>"
        in page
    )
    daily = await gateway.get("/console/patterns?per=day")
    assert daily.status == 200 and "Attempts per day" in await daily.text()
    assert (await gateway.get("/console/patterns?per=week")).status == 400
    await sign_in(gateway, token(sub="root", scopes="audit:read:all"))
    everyone = await (await gateway.get("/console/patterns")).text()
    assert "globex" in everyone and "acme" in everyone
