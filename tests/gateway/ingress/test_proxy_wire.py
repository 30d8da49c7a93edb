"""Reverse-proxy routes against a raw upstream that records every byte on the wire
(tests/gateway/ingress/wire.py): bodies forwarded byte for byte with consistent
framing, nothing smuggled past the pipeline, another caller's request intact; each
route's scope and the tenant's rate; the header allowlist both ways; every spelling
of an intercepted path intercepted or refused, never forwarded with its code body.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records, auth, make_settings, require_root
from tests.gateway.ingress.wire import WireUpstream, raw_exchange, status_of

pytestmark = pytest.mark.integration

Token = Callable[..., str]
SECRET = "sk-upstream-credential"
SCOPES = "exec:python proxy:llm"
CODE = {"lang": "python", "source": {"text": "print(6*7)"}}


@pytest.fixture
async def upstream() -> AsyncIterator[WireUpstream]:
    up = WireUpstream()
    await up.start()
    yield up
    await up.close()


@pytest.fixture
def settings(tmp_path: Path, upstream: WireUpstream) -> Settings:
    require_root()
    (tmp_path / "cred").write_text(SECRET)
    routes = [
        {
            "prefix": "/llm",
            "upstream_url": upstream.url + "/api",
            "credential_header": "Authorization",
            "credential_value_file": str(tmp_path / "cred"),
            "read_timeout_s": 5,
            "forward_headers": ["X-Custom"],
            "intercept": [
                {
                    "path": "/llm/run",
                    "language_pointer": "/lang",
                    "code_pointer": "/source/text",
                    "answer_template": {"object": "run"},
                    "answer_pointers": {"stdout": "/output", "error": "/error"},
                }
            ],
        },
        {"prefix": "/scoped", "upstream_url": upstream.url + "/api", "scope": "models:call"},
    ]
    return make_settings(
        tmp_path,
        EXECGATE_INGRESS_ROUTES=json.dumps(routes),
        EXECGATE_TENANTS_SLOW_RATE_PER_S="0.001",
        EXECGATE_TENANTS_SLOW_BURST="2",
    )


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings) -> TestClient:
    return await aiohttp_client(create_app(settings))


def smuggling_gzip(hidden: bytes) -> bytes:
    """A gzip body whose decoded form holds `hidden` right after as many bytes as
    the compressed body has: what an upstream told the compressed length but sent
    the decoded bytes reads as a second request."""
    size = 64
    for _ in range(20):
        packed = gzip.compress(b"A" * size + hidden, mtime=0)
        if len(packed) == size:
            return packed
        size = len(packed)
    raise AssertionError("no fixed point")


def padded_gzip(content: bytes, extra_bytes: int) -> bytes:
    """A gzip member with an FEXTRA field: thousands of bytes that decode to a few."""
    extra = b"XP" + struct.pack("<H", extra_bytes - 4) + b"\0" * (extra_bytes - 4)
    header = b"\x1f\x8b\x08\x04" + b"\0\0\0\0" + b"\x00\xff" + struct.pack("<H", len(extra))
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    data = deflate.compress(content) + deflate.flush()
    trailer = struct.pack("<II", zlib.crc32(content), len(content))
    packed = header + extra + data + trailer
    assert gzip.decompress(packed) == content
    return packed


HIDDEN_RUN = (
    b"POST /api/run HTTP/1.1\r\nHost: up\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(json.dumps(CODE)), json.dumps(CODE).encode())
)


async def test_a_gzip_body_arrives_byte_identical_and_smuggles_nothing(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    body = smuggling_gzip(HIDDEN_RUN)
    headers = {**auth(token(scopes=SCOPES)), "Content-Encoding": "gzip"}
    resp = await client.post("/llm/echo", data=body, headers=headers)
    assert resp.status == 200, await resp.text()

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):
            yield body[i : i + 7]

    resp = await client.post("/llm/echo", data=chunks(), headers=headers)
    assert resp.status == 200, await resp.text()
    # And one more on the (pooled) upstream connection: read as its own request.
    resp = await client.post("/llm/echo", data=b"after", headers=auth(token(scopes=SCOPES)))
    assert await resp.json() == {"target": "/api/echo", "bytes": 5}

    assert upstream.errors == []
    assert upstream.targets() == ["/api/echo"] * 3  # never /api/run
    sized, chunked, after = upstream.requests
    assert sized.body == body and chunked.body == body  # byte for byte
    assert sized.header("Content-Encoding") == chunked.header("Content-Encoding") == "gzip"
    assert sized.header("Content-Length") == str(len(body))
    assert sized.header("Transfer-Encoding") is None
    assert chunked.header("Transfer-Encoding") == "chunked"
    assert chunked.header("Content-Length") is None
    assert after.body == b"after" and after.header("Content-Encoding") is None
    # Sound framing keeps the upstream connection pooled: all three shared one.
    assert sized.connection == chunked.connection == after.connection


async def test_a_body_that_decodes_short_never_eats_the_next_callers_request(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    # 4,023 bytes on the wire that decode to 2; the upstream answers before reading.
    body = padded_gzip(b"{}", 3999)
    assert len(body) == 4023
    tok = token(scopes=SCOPES)
    resp = await client.post(
        "/llm/early", data=body, headers={**auth(tok), "Content-Encoding": "gzip"}
    )
    assert resp.status == 200
    second = b'{"caller": "b", "pad": "' + b"b" * 5000 + b'"}'
    resp = await client.post(
        "/llm/echo",
        data=second,
        headers={**auth(tok), "Content-Type": "application/json", "X-Request-Id": "b"},
    )
    assert resp.status == 200, await resp.text()
    assert upstream.errors == []
    early, echo = upstream.requests
    assert early.body == body
    assert echo.target == "/api/echo" and echo.body == second
    assert echo.header("X-Request-Id") == "b" and echo.header("Content-Type") == "application/json"


async def test_framing_an_upstream_could_read_otherwise_is_refused(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    tok = token(scopes=SCOPES)
    smuggled = b"GET /llm/smuggled HTTP/1.1\r\nHost: a\r\n\r\n"
    head = b"POST /llm/echo HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n" % tok.encode()
    chunked = b"3\r\nabc\r\n0\r\n\r\n"
    variants = {
        "te and cl": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        "chunked, identity": b"Transfer-Encoding: chunked, identity\r\n\r\n" + chunked,
        "identity, chunked": b"Transfer-Encoding: identity, chunked\r\n\r\n" + chunked,
        "te twice": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked,
        "te obs-fold": b"Transfer-Encoding:\r\n chunked\r\n\r\n" + chunked,
        "header obs-fold": b"Content-Length: 3\r\nX-A: b\r\n c\r\n\r\nabc",
        "cl plus": b"Content-Length: +3\r\n\r\nabc",
        "cl twice": b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
        "cl list": b"Content-Length: 3, 3\r\n\r\nabc",
        "cl space before colon": b"Content-Length : 3\r\n\r\nabc",
        "te gzip": b"Transfer-Encoding: gzip, chunked\r\n\r\n" + chunked,
        "bare lf chunks": b"Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
        "cl padded": b"Content-Length:  3 \r\n\r\nabc",
        "chunk extension": b"Transfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\n\r\n",
        "websocket upgrade": b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Content-Length: 3\r\n\r\nabc",
        "other upgrade": b"Connection: upgrade\r\nUpgrade: h2c\r\nContent-Length: 3\r\n\r\nabc",
    }
    for name, rest in variants.items():
        before = len(upstream.requests)
        try:
            answer = await raw_exchange(client.port, head + rest + smuggled)
        except (ConnectionError, EOFError) as exc:  # the gateway may just hang up
            answer = f"HTTP/1.1 400 {type(exc).__name__}".encode()
        arrived = upstream.requests[before:]
        if status_of(answer) == 200:
            # Accepted by the server's parser: forwarded as one body, framed one way.
            assert [r.body for r in arrived] == [b"abc"], name
            assert (arrived[0].header("Content-Length") == "3") != (
                arrived[0].header("Transfer-Encoding") == "chunked"
            ), name
        else:
            assert status_of(answer) == 400 and arrived == [], name
    assert upstream.errors == []
    assert all("smuggled" not in t for t in upstream.targets())


async def test_an_upstream_connection_in_doubt_is_not_reused(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    tok = token(scopes=SCOPES)
    # The upstream answers after the headers; the caller then stops mid-body.
    head = (
        b"POST /llm/early HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: 100000\r\n\r\n" % tok.encode()
    )
    answer = await raw_exchange(client.port, head + b"x" * 1000)
    assert status_of(answer) == 200
    resp = await client.post("/llm/echo", data=b"intact", headers=auth(tok))
    assert await resp.json() == {"target": "/api/echo", "bytes": 6}
    early, echo = upstream.requests
    assert echo.body == b"intact" and echo.connection != early.connection


async def test_an_answer_cut_short_ends_the_callers_connection_too(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    tok = token(scopes=SCOPES)
    request = b"GET /llm/short HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    writer.write(request % tok.encode())
    # The caller gets the promised length's head, fewer bytes, then the end of the
    # connection: never a gap that the next answer on it would fill.
    received = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    head, body = received.split(b"\r\n\r\n", 1)
    assert b"200 OK" in head.split(b"\r\n")[0]
    assert int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]) > len(body)
    resp = await client.get("/llm/echo", headers=auth(tok))
    assert await resp.json() == {"target": "/api/echo", "bytes": 0}
    short, echo = upstream.requests
    assert echo.connection != short.connection


async def test_compressed_bodies_the_gateway_reads_are_bounded(
    client: TestClient, token: Token, upstream: WireUpstream, settings: Settings
) -> None:
    tok = token(scopes=SCOPES)
    headers = {**auth(tok), "Content-Encoding": "gzip", "Content-Type": "application/json"}
    # The pipeline reads the decoded body: the code the upstream would have run.
    resp = await client.post(
        "/llm/run", data=gzip.compress(json.dumps(CODE).encode()), headers=headers
    )
    assert resp.status == 200 and (await resp.json())["output"] == "42\n"
    limit = settings.server.max_body_bytes
    bomb = gzip.compress(b"0" * (limit + 1))
    assert len(bomb) < limit // 100
    for path in ("/llm/run", "/v1/executions"):
        resp = await client.post(path, data=bomb, headers=headers)
        assert resp.status == 413, path
        assert (await resp.json())["error"]["code"] == "too_large"
    resp = await client.post("/llm/run", data=b"xx", headers={**headers, "Content-Encoding": "br"})
    assert resp.status == 415
    assert upstream.requests == []


async def test_each_route_needs_its_scope(
    client: TestClient, token: Token, upstream: WireUpstream, settings: Settings
) -> None:
    cases = [
        ("/llm/echo", "exec:python", 403),  # any valid token used to pass
        ("/llm/echo", "proxy:other", 403),
        ("/llm/echo", "proxy:llm", 200),
        ("/scoped/echo", "proxy:scoped", 403),  # the route names its own scope
        ("/scoped/echo", "models:call", 200),
        ("/llm/echo", "", 401),
    ]
    for path, scopes, status in cases:
        headers = auth(token(scopes=scopes)) if scopes else {}
        resp = await client.get(path, headers=headers)
        assert resp.status == status, (path, scopes)
        if status == 403:
            error = (await resp.json())["error"]
            assert error["code"] == "forbidden" and error["reason"] == "missing_scope"
    assert len(upstream.requests) == 2
    refused = [r for r in audit_records(settings) if r["type"] == "auth.failed"]
    assert [r["code"] for r in refused] == ["forbidden"] * 3 + ["unauthenticated"]
    assert {r["tenant"] for r in refused[:3]} == {"acme"}


async def test_pass_through_spends_the_tenants_rate(
    client: TestClient, token: Token, upstream: WireUpstream, settings: Settings
) -> None:
    slow = auth(token(tenant="slow", scopes=SCOPES))
    assert (await client.get("/llm/echo", headers=slow)).status == 200
    assert (await client.get("/llm/echo", headers=slow)).status == 200
    resp = await client.get("/llm/echo", headers=slow)
    assert resp.status == 429
    assert (await resp.json())["error"]["code"] == "rate_limited"
    assert int(resp.headers["Retry-After"]) >= 1
    assert resp.headers["RateLimit"].startswith('"rate";r=0;')
    assert '"rate";q=2' in resp.headers["RateLimit-Policy"]
    # The same budget as its executions: the intercepted run is refused too.
    resp = await client.post("/llm/run", json=CODE, headers=slow)
    assert resp.status == 429
    # Another tenant is unaffected.
    assert (await client.get("/llm/echo", headers=auth(token(scopes=SCOPES)))).status == 200
    assert len(upstream.requests) == 3
    limited = [r for r in audit_records(settings) if r["type"] == "rate.limited"]
    assert limited[0]["tenant"] == "slow" and limited[0]["ingress"] == "proxy"
    assert limited[0]["code"] == "rate_limited"


async def test_headers_cross_by_allowlist_both_ways(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    upstream.answer_headers = [
        ("Set-Cookie", "session=upstream; Path=/"),
        ("Strict-Transport-Security", "max-age=63072000; includeSubDomains"),
        ("Access-Control-Allow-Origin", "*"),
        ("Access-Control-Allow-Credentials", "true"),
        ("Alt-Svc", 'h3=":443"; ma=86400'),
        ("Clear-Site-Data", '"cookies"'),
        ("WWW-Authenticate", 'Basic realm="upstream"'),
        ("Cache-Control", "no-store"),
        ("X-Ratelimit-Remaining", "99"),
    ]
    tok = token(scopes=SCOPES)
    sent = {
        "Cookie": "gateway_session=secret",
        "Forwarded": "for=6.6.6.6;host=internal",
        "X-Real-IP": "6.6.6.6",
        "X-Original-URL": "/api/run",
        "X-Rewrite-URL": "/api/run",
        "X-HTTP-Method-Override": "DELETE",
        "X-Forwarded-Host": "evil.example",
        "X-Forwarded-Prefix": "/admin",
        "X-Unlisted": "mine",
        "Proxy-Authorization": f"Bearer {tok}",
        "Accept": "application/json",
        "Content-Type": "text/plain",
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "X-Custom": "route-allows-it",
        "User-Agent": "caller/1",
    }
    resp = await client.post(
        "/llm/echo",
        data=b"hi",
        headers={**auth(tok), **sent},
        skip_auto_headers=["Accept-Encoding"],
    )
    assert resp.status == 200
    (seen,) = upstream.requests
    assert seen.names() == {
        "host",
        "accept",
        "content-type",
        "traceparent",
        "x-custom",
        "user-agent",
        "content-length",
        "authorization",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
    }
    assert seen.header("Authorization") == SECRET
    assert seen.header("X-Forwarded-Host") != "evil.example"
    assert seen.header("X-Forwarded-For") == "127.0.0.1"
    assert tok not in repr(seen.headers) and "secret" not in repr(seen.headers)

    returned = {k.lower() for k in resp.headers}
    for dropped in ("set-cookie", "strict-transport-security", "alt-svc", "clear-site-data"):
        assert dropped not in returned
    assert not any(k.startswith("access-control-") for k in returned)
    assert "www-authenticate" not in returned
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["X-Ratelimit-Remaining"] == "99"


def path_variants() -> list[str]:
    """Spellings of /llm/run that some server reads as /llm/run (or nearly)."""
    run = ["run", "RUN", "Run", "%72un", "%52%55%4E", "r%75n"]
    tails = ["", "/", "//", ".", "..", ";", ";x=1", "%00", "%20", "%09", "%3f", "%23"]
    variants = [f"/llm/{r}{t}" for r in run for t in tails]
    variants += [
        "/llm//run",
        "/llm/./run",
        "/llm/x/../run",
        "/llm/%2e/run",
        "/llm/%2E%2E/llm/run",
        "/llm%2frun",
        "/llm%2Frun",
        "/llm/x%2f..%2frun",
        "/llm%5crun",
        "/llm/%252e/run",
        "/llm/%2572un",
        "/llm/%EF%BD%92un",  # fullwidth r
        "/llm/r%C3%BCn",
        "/llm/run%c0%af",
        "/llm/%zzrun",
        "/llm/run;jsessionid=1/",
        "/llm/;/run",
        "/llm/run/%2e",
    ]
    return variants


async def test_no_spelling_or_method_carries_code_past_the_pipeline(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    tok = token(scopes=SCOPES)
    body = json.dumps(CODE).encode()
    outcomes: dict[int, int] = {}
    for method in ("POST", "PUT", "PATCH", "DELETE", "GET", "OPTIONS", "PROPFIND"):
        for path in path_variants():
            request = (
                f"{method} {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {tok}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode() + body
            answer = await raw_exchange(client.port, request)
            status = status_of(answer)
            outcomes[status] = outcomes.get(status, 0) + 1
            if status == 200:  # intercepted: run here, answered in the upstream's shape
                assert method == "POST", path
                answered = json.loads(answer.split(b"\r\n\r\n", 1)[1])
                assert answered.get("output") == "42\n", (path, answered)
            else:
                assert status in (400, 404, 405), (method, path, answer[:300])
    assert upstream.requests == [], upstream.targets()
    assert outcomes.get(200, 0) >= 10  # the plain respellings are intercepted, not just refused
    # Bodyless methods still reach the upstream's other paths of the same name.
    resp = await client.get("/llm/run", headers=auth(tok))
    assert resp.status == 200 and upstream.targets() == ["/api/run"]
    assert upstream.requests[0].body == b""


async def test_an_aiohttp_client_is_refused_the_same_way(
    client: TestClient, token: Token, upstream: WireUpstream
) -> None:
    tok = token(scopes=SCOPES)
    async with aiohttp.ClientSession() as session:
        for path in ("/llm/run;x=1", "/llm/run%00", "/llm/x%2f..%2frun"):
            url = client.make_url("").with_path(path, encoded=True)
            resp = await session.put(url, json=CODE, headers=auth(tok))
            assert resp.status == 400, path
            assert (await resp.json())["error"]["code"] == "invalid_request"
        resp = await session.put(client.make_url("/llm/run"), json=CODE, headers=auth(tok))
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
    assert upstream.requests == []
