"""The console's audit trail pages back through the log, newest first, with a seq cursor."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestClient

from gateway.appkeys import SERVICES
from gateway.console.audit_page import PAGE_RECORDS
from tests.gateway.console.conftest import sign_in

pytestmark = pytest.mark.integration

SEQ = re.compile(r"<tr><td>(\d+)</td>")
OLDER = re.compile(r'<a href="([^"]+)" rel="next">')


def shown(page: str) -> list[int]:
    return [int(s) for s in SEQ.findall(page)]


async def test_older_pages_follow_the_cursor_to_the_first_record(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    audit = gateway.server.app[SERVICES].audit
    await asyncio.gather(
        *(audit.append("test.filler", tenant="acme", n=i) for i in range(PAGE_RECORDS + 50))
    )
    await sign_in(gateway, token(sub="sam", scopes="audit:read:all"))
    pages, url = [], "/console/audit?type=test.filler"
    while url:
        resp = await gateway.get(url)
        page = await resp.text()
        assert resp.status == 200, page
        pages.append(shown(page))
        older = OLDER.search(page)
        url = html.unescape(older.group(1)) if older else ""
        # The filters travel with the cursor.
        assert not url or ("type=test.filler" in url and "before=" in url)
    seqs = [s for p in pages for s in p]
    assert len(pages) == 2 and len(pages[0]) == PAGE_RECORDS
    assert len(seqs) == PAGE_RECORDS + 50 == len(set(seqs))
    assert seqs == sorted(seqs, reverse=True)
    # The cursor is the last shown record's seq: the next page starts just below it.
    resp = await gateway.get(f"/console/audit?type=test.filler&before={seqs[0]}")
    assert shown(await resp.text())[0] == seqs[1]
    for bad in ("x", "-1", "9" * 40):
        assert (await gateway.get(f"/console/audit?before={bad}")).status == 400


async def test_paging_keeps_to_the_readers_tenant(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    audit = gateway.server.app[SERVICES].audit
    await asyncio.gather(
        *(audit.append("test.filler", tenant=("acme", "globex")[i % 2]) for i in range(20))
    )
    await sign_in(gateway, token(tenant="globex", sub="gina", scopes="audit:read"))
    page = await (await gateway.get("/console/audit?type=test.filler&before=999999")).text()
    assert len(shown(page)) == 10 and "acme" not in page
