"""Every error leaves the gateway in one shape: {"error": {"code", "message", ...}}."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway import errors
from gateway.errors import GatewayError
from gateway.json_codec import dumps

log = logging.getLogger(__name__)

_HTTP_KINDS = {
    404: errors.NOT_FOUND,
    405: errors.METHOD_NOT_ALLOWED,
    413: errors.TOO_LARGE,
    415: errors.UNSUPPORTED_MEDIA_TYPE,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(error: GatewayError) -> web.Response:
    return web.Response(
        status=error.status,
        body=dumps(error.body()),
        content_type="application/json",
        headers=error.headers,
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except GatewayError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = _HTTP_KINDS.get(exc.status)
        if kind is None:
            kind = errors.ErrorKind("http_error", exc.status, "rejected")
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_response(GatewayError(kind, exc.reason, headers=headers))
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(GatewayError(errors.INTERNAL, "internal error"))
