"""Pass-through of a reverse-proxy route: the request streamed to the upstream and
its answer streamed back as it arrives (SSE and chunked bodies are never buffered).

The body goes upstream exactly as it arrived (the server does not decompress it),
framed by the gateway: the Content-Length the server's parser counted, or chunked
when the caller sent chunks; anything ambiguous (both, an unknown or listed
Transfer-Encoding) is refused before a byte leaves. An upstream connection whose
framing is in doubt (its answer came before the whole body was sent, or either side
ended early) is closed, never returned to the pool for another caller.

Request headers are an allowlist and answers drop origin-wide headers
(gateway/proxy/headers.py); the caller's Authorization never leaves the gateway, the
route's configured credential is added instead; X-Forwarded-For/-Proto/-Host are
set by the gateway, never copied from the caller (who could forge them).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from gateway import errors
from gateway.errors import GatewayError
from gateway.proxy.headers import connection_named, forwarded, returned
from gateway.settings.ingress import RouteSettings

CHUNK_BYTES = 64 * 1024
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class Route:
    settings: RouteSettings
    # (header, value) from the route's credential file, read at start.
    credential: tuple[str, str] | None

    @property
    def forward_headers(self) -> frozenset[str]:
        return frozenset(h.lower() for h in self.settings.forward_headers)


def upstream_headers(request: web.Request, route: Route) -> CIMultiDict[str]:
    hop = connection_named(request.headers.getall("Connection", []))
    extra = route.forward_headers - hop
    out = CIMultiDict((k, v) for k, v in request.headers.items() if forwarded(k, extra))
    out["X-Forwarded-For"] = request.remote or ""
    out["X-Forwarded-Proto"] = request.scheme
    out["X-Forwarded-Host"] = request.host
    if route.credential is not None:
        out[route.credential[0]] = route.credential[1]
    return out


def downstream_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    hop = connection_named(headers.getall("Connection", []))
    if "Transfer-Encoding" in headers:
        # The gateway re-frames a chunked answer; a Content-Length beside it is a lie.
        hop.add("content-length")
    return CIMultiDict((k, v) for k, v in headers.items() if returned(k, hop))


def body_length(request: web.Request) -> int | None:
    """The Content-Length to forward, or None for a chunked body (or none at all).
    Refuses framing an upstream could read differently from the gateway's parser."""
    connection = ",".join(request.headers.getall("Connection", [])).lower()
    if "Upgrade" in request.headers or "upgrade" in connection:
        # The rest of an upgraded connection would go upstream as one endless body.
        raise GatewayError(errors.INVALID_REQUEST, "connection upgrades are not proxied")
    te = request.headers.getall("Transfer-Encoding", [])
    cl = request.headers.getall("Content-Length", [])
    if te and cl:
        raise GatewayError(errors.INVALID_REQUEST, "Transfer-Encoding and Content-Length together")
    if te:
        if len(te) != 1 or te[0].strip().lower() != "chunked":
            raise GatewayError(errors.INVALID_REQUEST, "Transfer-Encoding other than chunked")
        return None
    if cl:
        if len(cl) != 1 or not _DIGITS.fullmatch(cl[0].strip()):
            raise GatewayError(errors.INVALID_REQUEST, "malformed Content-Length")
        return int(cl[0])
    return None


class _Body:
    """The caller's body as it arrives; `whole` once every byte was handed on."""

    def __init__(self, request: web.Request, length: int | None) -> None:
        self._request, self._length = request, length
        self.sent = 0
        self.whole = not request.body_exists

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self._request.content
        async for chunk in content.iter_chunked(CHUNK_BYTES):
            self.sent += len(chunk)
            if self._length is not None and self.sent > self._length:
                raise ValueError("body longer than its Content-Length")
            # Whole before the last yield: the upstream may answer as soon as it has it.
            self.whole = self.sent == self._length
            yield chunk
        if self._length is not None and self.sent != self._length:
            # The upstream would wait for the rest, or read another caller's request.
            raise ValueError("body shorter than its Content-Length")
        self.whole = True


def upstream_url(request: web.Request, route: RouteSettings) -> URL:
    """The route's URL and the rest of the path as received (already checked)."""
    rest = request.rel_url.raw_path[len(route.prefix) :]
    url = route.upstream_url.rstrip("/") + ("/" + rest.lstrip("/") if rest else "")
    if request.rel_url.raw_query_string:
        url += "?" + request.rel_url.raw_query_string
    return URL(url, encoded=True)


async def pass_through(
    http: aiohttp.ClientSession,
    request: web.Request,
    route: Route,
    on_answer: Callable[[int], Awaitable[None]],
) -> web.StreamResponse:
    """Forward and stream back; `on_answer(status)` runs (the audit) before the caller
    sees anything. Raises GatewayError (400 framing, 502/504) while nothing was sent."""
    settings = route.settings
    length = body_length(request)
    headers = upstream_headers(request, route)
    if length is not None:
        headers["Content-Length"] = str(length)
    body = _Body(request, length)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
    )
    try:
        upstream = await http.request(
            request.method,
            upstream_url(request, settings),
            headers=headers,
            data=body.chunks() if request.body_exists else None,
            timeout=timeout,
            allow_redirects=False,
        )
    except TimeoutError:
        raise GatewayError(errors.UPSTREAM_TIMEOUT, "upstream did not answer in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise GatewayError(
            errors.UPSTREAM_UNAVAILABLE, f"upstream unreachable: {type(exc).__name__}"
        ) from None
    relayed = False
    try:
        await on_answer(upstream.status)
        response = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=downstream_headers(upstream.headers),
        )
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (TimeoutError, aiohttp.ClientError, OSError):
            # Too late for a status: the caller sees the stream end early.
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        relayed = True
        return response
    finally:
        if relayed and body.whole:
            upstream.release()
        else:
            # Framing in doubt: this connection carries no other request.
            upstream.close()
