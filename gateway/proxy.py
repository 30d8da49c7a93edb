"""Pass-through of a reverse-proxy route: the request streamed to the upstream and
its answer streamed back as it arrives (SSE and chunked bodies are never buffered).

Hop-by-hop headers (and those the Connection header names) stay on their hop; the
caller's Authorization never leaves the gateway, the route's configured credential
is added instead; X-Forwarded-For/-Proto/-Host are set by the gateway, not copied
from the caller (who could forge them).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from gateway import errors
from gateway.errors import GatewayError
from gateway.settings_ingress import RouteSettings

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded upstream: the caller's credentials and what the gateway sets itself.
_NOT_FORWARDED = frozenset(
    {"authorization", "host", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"}
)
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Route:
    settings: RouteSettings
    # (header, value) from the route's credential file, read at start.
    credential: tuple[str, str] | None


def _hop_headers(headers: CIMultiDictProxy[str]) -> set[str]:
    named = {h.strip().lower() for v in headers.getall("Connection", []) for h in v.split(",")}
    return HOP_BY_HOP | named


def upstream_headers(request: web.Request, route: Route) -> CIMultiDict[str]:
    drop = _hop_headers(request.headers) | _NOT_FORWARDED
    out = CIMultiDict((k, v) for k, v in request.headers.items() if k.lower() not in drop)
    out["X-Forwarded-For"] = request.remote or ""
    out["X-Forwarded-Proto"] = request.scheme
    out["X-Forwarded-Host"] = request.host
    if route.credential is not None:
        out[route.credential[0]] = route.credential[1]
    return out


def downstream_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    drop = _hop_headers(headers)
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def upstream_url(request: web.Request, route: RouteSettings) -> str:
    rest = request.rel_url.raw_path[len(route.prefix) :]
    url = route.upstream_url.rstrip("/") + ("/" + rest.lstrip("/") if rest else "")
    if request.rel_url.raw_query_string:
        url += "?" + request.rel_url.raw_query_string
    return url


async def pass_through(
    http: aiohttp.ClientSession,
    request: web.Request,
    route: Route,
    on_answer: Callable[[int], Awaitable[None]],
) -> web.StreamResponse:
    """Forward and stream back; `on_answer(status)` runs (the audit) before the caller
    sees anything. Raises GatewayError (502/504) while nothing has been sent yet."""
    settings = route.settings
    # "/prefix/../x" would leave the route's base path at the upstream.
    if any(segment in (".", "..") for segment in request.path.split("/")):
        raise GatewayError(errors.INVALID_REQUEST, "dot segments are not forwarded")
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
    )
    data = request.content.iter_chunked(CHUNK_BYTES) if request.body_exists else None
    try:
        upstream = await http.request(
            request.method,
            upstream_url(request, settings),
            headers=upstream_headers(request, route),
            data=data,
            timeout=timeout,
            allow_redirects=False,
        )
    except TimeoutError:
        raise GatewayError(errors.UPSTREAM_TIMEOUT, "upstream did not answer in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise GatewayError(
            errors.UPSTREAM_UNAVAILABLE, f"upstream unreachable: {type(exc).__name__}"
        ) from None
    async with upstream:
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
        return response
