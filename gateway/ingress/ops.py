"""Operational endpoints: liveness, readiness, metrics, the OpenAPI document."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from gateway import __version__
from gateway.appkeys import SERVICES
from gateway.ingress.openapi import build_openapi
from gateway.telemetry.metrics import CONTENT_TYPE

routes = web.RouteTableDef()
OPENAPI = web.AppKey("openapi", bytes)


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    checks: dict[str, dict[str, object]] = {}
    policy_ok, policy_detail = await svc.engine.health()
    checks["policy"] = {"ok": policy_ok, "detail": policy_detail}
    names = list(svc.backends)
    healths = await asyncio.gather(*(svc.backends[n].health() for n in names))
    for name, health in zip(names, healths, strict=True):
        on, why_not = svc.backends[name].capture_status()
        checks[f"backend:{name}"] = {
            "ok": health.ok,
            "detail": health.detail,
            # What the code tries is recorded (off: why not; `capture.required` makes
            # that unhealthy instead).
            "capture": "on" if on else f"off: {why_not}",
        }
        held = svc.out_of_service.get(name)
        if held:
            checks[f"backend:{name}"] = {
                **checks[f"backend:{name}"],
                "ok": False,
                "detail": f"out of service: {held}",
            }
    state_ok, state_detail = await svc.admission.state.health()
    checks["state"] = {"ok": state_ok, "detail": state_detail}
    checks["audit"] = {
        "ok": svc.audit.healthy,
        "detail": "" if svc.audit.healthy else "audit log not writable",
    }
    ready = all(c["ok"] for c in checks.values())
    missing = sorted(name for name, c in checks.items() if not c["ok"])
    body = {"status": "ready" if ready else "not_ready", "checks": checks}
    if missing:
        body["missing"] = missing
    return web.json_response(body, status=200 if ready else 503)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    if not svc.settings.server.metrics_public:
        raise web.HTTPNotFound()
    return web.Response(body=svc.metrics.render(), headers={"Content-Type": CONTENT_TYPE})


@routes.get("/openapi.json")
async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type="application/json")


def openapi_document() -> bytes:
    return json.dumps(build_openapi(__version__)).encode()
