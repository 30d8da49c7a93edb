"""Which headers cross a reverse-proxy route, each way (pure; used by gateway/proxy/forward.py
and checked in the route settings).

Upstream: an allowlist. Only end-to-end headers about the request's content and
caching, plus the names a route adds in `forward_headers`; everything else (Cookie,
Forwarded, X-Real-IP, X-Original-URL, method overrides, whatever a client invents)
stays at the gateway. Framing (Content-Length, Transfer-Encoding) is the gateway's
own, never copied. Downstream: the upstream's answer keeps its headers except those
that act on the gateway's origin as a whole rather than on this one response.
"""

from __future__ import annotations

from collections.abc import Iterable

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

# Forwarded upstream as the caller sent them (Content-Encoding with the body's own
# bytes: the gateway forwards bodies exactly as received).
FORWARDED = frozenset(
    {
        "accept",
        "accept-encoding",
        "accept-language",
        "cache-control",
        "content-encoding",
        "content-language",
        "content-type",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "idempotency-key",
        "last-event-id",
        "range",
        "traceparent",
        "tracestate",
        "user-agent",
        "x-request-id",
    }
)

# Never forwarded, not even when a route names them: credentials, what the gateway
# sets itself, framing, and headers that tell an upstream to read the request as
# another path, method or client.
NEVER_FORWARDED = HOP_BY_HOP | {
    "authorization",
    "content-length",
    "cookie",
    "expect",
    "forwarded",
    "host",
    "x-client-ip",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-proto",
    "x-forwarded-server",
    "x-http-method",
    "x-http-method-override",
    "x-method-override",
    "x-original-url",
    "x-real-ip",
    "x-rewrite-url",
}

# Dropped from upstream answers: state or policy for the gateway's whole origin
# (cookies, HSTS and pins, Alt-Svc, Clear-Site-Data, CORS grants, credential
# challenges that concern the gateway's own credential for the upstream).
NOT_RETURNED = frozenset(
    {
        "alt-svc",
        "clear-site-data",
        "expect-ct",
        "public-key-pins",
        "public-key-pins-report-only",
        "set-cookie",
        "set-cookie2",
        "strict-transport-security",
        "www-authenticate",
    }
)
NOT_RETURNED_PREFIXES = ("access-control-",)


def connection_named(values: Iterable[str]) -> set[str]:
    """Hop-by-hop headers plus those a Connection header names."""
    return set(HOP_BY_HOP) | {h.strip().lower() for v in values for h in v.split(",") if h.strip()}


def forwarded(name: str, extra: frozenset[str]) -> bool:
    lower = name.lower()
    return lower not in NEVER_FORWARDED and (lower in FORWARDED or lower in extra)


def returned(name: str, hop: set[str]) -> bool:
    lower = name.lower()
    return (
        lower not in hop
        and lower not in NOT_RETURNED
        and not lower.startswith(NOT_RETURNED_PREFIXES)
    )
