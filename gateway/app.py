"""The aiohttp application: transport at the edge, the pipeline inside.

Shared resources are created and torn down in pairs by cleanup contexts and live
on the app under typed keys; nothing is global.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from aiohttp import web

from backends import backend_class
from backends.base import BackendError, SandboxBackend, SandboxEvent
from backends.capture.host import TracerHub
from gateway.admission.gate import Admission
from gateway.appkeys import PIPELINE, SERVICES, SETTINGS, TRACERS
from gateway.approvals.desk import ApprovalDesk
from gateway.approvals.webhooks import WebhookSecretError
from gateway.audit.log import AuditLog, AuditUnavailable
from gateway.auth.tokens import TokenVerifier
from gateway.console import add_console
from gateway.escape.selftest import SelfTest
from gateway.executions.recovery import recover
from gateway.executions.store import ExecutionStore
from gateway.ingress import admin as admin_api
from gateway.ingress import approvals as approvals_api
from gateway.ingress import audit as audit_api
from gateway.ingress import mcp as mcp_api
from gateway.ingress import proxy as proxy_api
from gateway.ingress import rest, toolcalls
from gateway.ingress.ops import OPENAPI, openapi_document
from gateway.ingress.ops import routes as ops_routes
from gateway.middleware import error_middleware
from gateway.pipeline import Pipeline
from gateway.policy.base import LogMasker, PolicyEngine
from gateway.policy.inputs import DecisionInputLog, decision_inputs_path
from gateway.policy.mask import MaskError
from gateway.review.notifier import ReviewNotifier
from gateway.services import Services
from gateway.settings.model import Settings
from gateway.state import StateUnavailable, make_state
from gateway.telemetry import live as metrics_live
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import Tracing

log = logging.getLogger(__name__)


class StartupError(Exception):
    """A resource the gateway needs could not be started; the message says which."""


def make_engine(settings: Settings) -> PolicyEngine:
    policy = settings.policy
    if policy.engine == "embedded":
        from gateway.policy.wasm import WasmEngine

        return WasmEngine(Path(policy.path), timeout_ms=policy.timeout_ms, opa_bin=policy.opa_bin)
    if policy.engine == "rego-cpp":
        from gateway.policy.embedded import EmbeddedEngine

        return EmbeddedEngine(Path(policy.path), timeout_ms=policy.timeout_ms)
    from gateway.policy.opa import OpaEngine

    return OpaEngine(policy.opa_url, timeout_ms=policy.timeout_ms, bundle=policy.opa_bundle)


def make_backends(settings: Settings, tracers: TracerHub) -> dict[str, SandboxBackend]:
    backends: dict[str, SandboxBackend] = {}
    for name in settings.enabled_backends():
        cls = backend_class(name)
        extra = {"tracers": tracers} if cls.shares_host_tracer else {}
        backends[name] = cls(settings.backend_settings(name), **extra)  # type: ignore[call-arg]
    return backends


async def build_services(
    settings: Settings, stack: AsyncExitStack, tracers: TracerHub | None = None
) -> Services:
    """Start every shared resource; each one's close is pushed onto `stack`.
    `tracers`: host tracers the caller owns (and closes); None makes the gateway's own."""
    audit = AuditLog(Path(settings.audit.path), flush_interval_ms=settings.audit.flush_interval_ms)
    await audit.start()
    stack.push_async_callback(audit.close)
    # The last record of a run that started: after every other component has closed
    # (the stack unwinds in reverse), so records of killed executions come before it.
    started: list[bool] = []
    stack.push_async_callback(_record_stop, audit, started)

    try:
        services = await _start_components(settings, audit, stack, tracers)
        # Before gateway.started: that record says everything before it is accounted for.
        await recover(audit, services.store)
    except Exception as exc:
        # The operator's first question after a failed start: what, and when.
        await audit.append(
            "gateway.start_failed",
            request_id=None,
            execution_id=None,
            tenant=None,
            subject=None,
            error=str(exc),
        )
        raise
    await audit.append(
        "gateway.started",
        request_id=None,
        execution_id=None,
        tenant=None,
        subject=None,
        policy_engine=settings.policy.engine,
        policy_revision=services.engine.revision,
        backends=sorted(services.backends),
    )
    started.append(True)
    if settings.policy.engine != "opa" and settings.policy.reload_interval_s > 0:
        from gateway.policy.reload import PolicyReloader

        reloader = PolicyReloader(
            services.engine, Path(settings.policy.path), audit, settings.policy.reload_interval_s
        )
        reloader.start()
        stack.push_async_callback(reloader.close)
    return services


def _audit_background_failures(name: str, backend: SandboxBackend, audit: AuditLog) -> None:
    """A sandbox made ahead that failed to start (no request saw it) is a
    `sandbox.event` too; a request's own start failures travel with its result."""
    failures = getattr(backend, "start_failures", None)
    if failures is None:
        return

    def observe(event: SandboxEvent) -> None:
        with contextlib.suppress(AuditUnavailable):  # its health says so already
            done = audit.submit(
                "sandbox.event", request_id=None, execution_id=None, tenant=None,
                subject=None, backend=name, kind=event.kind, detail=event.detail,
            )  # fmt: skip
            done.add_done_callback(_quiet)

    failures.observer = observe


def _quiet(done: asyncio.Future[dict[str, Any]]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.warning("audit: a sandbox.event was not written: %s", done.exception())


async def _record_stop(audit: AuditLog, started: list[bool]) -> None:
    if started:
        with contextlib.suppress(AuditUnavailable):
            await audit.append("gateway.stopped", reason="shutdown")


async def _start_components(
    settings: Settings, audit: AuditLog, stack: AsyncExitStack, tracers: TracerHub | None
) -> Services:
    verifier = TokenVerifier(settings.auth)
    await verifier.start()
    stack.push_async_callback(verifier.close)

    engine = make_engine(settings)
    await engine.start()
    stack.push_async_callback(engine.close)

    # One host tracer for every backend on the host kernel; closed after them all.
    if tracers is None:
        tracers = TracerHub()
        stack.push_async_callback(tracers.close)
    backends = make_backends(settings, tracers)
    for name, backend in backends.items():
        _audit_background_failures(name, backend, audit)
        try:
            await backend.start()
        except BackendError as exc:
            raise StartupError(f"backend {name}: {exc}") from exc
        stack.push_async_callback(backend.close)

    store = ExecutionStore(Path(settings.state.path) if settings.state.path else None)
    await store.start()
    stack.push_async_callback(store.close)

    # Limits, approvals and spent token ids: in-process/SQLite, or Redis for replicas.
    limit_state, approval_store = make_state(settings.state)
    admission = Admission(limit_state, settings.admission)
    try:
        await admission.start()
    except StateUnavailable as exc:
        raise StartupError(f"state ({settings.state.backend}): {exc}") from exc
    stack.push_async_callback(admission.close)
    await approval_store.start()
    stack.push_async_callback(approval_store.close)
    desk = ApprovalDesk(settings.approvals, approval_store, audit, store, callbacks=limit_state)
    await desk.start()
    stack.push_async_callback(desk.close)

    reviews = ReviewNotifier(settings.review, audit)
    try:
        await reviews.start()
    except WebhookSecretError as exc:
        raise StartupError(f"review.webhook_secret_file: {exc}") from exc
    stack.push_async_callback(reviews.close)

    inputs = None
    if settings.policy.record_inputs:
        inputs = DecisionInputLog(
            decision_inputs_path(settings),
            Path(settings.policy.path),
            retention_days=settings.policy.inputs_retention_days,
            max_bytes=settings.policy.inputs_max_mb * 1024 * 1024,
            engine=settings.policy.engine,
            masker=engine if isinstance(engine, LogMasker) else None,
        )
        try:
            await inputs.start()
            stack.push_async_callback(inputs.close)
        except MaskError as exc:
            # Without the mask nothing may be kept (inputs are never written unmasked);
            # the gateway still serves, and says loudly that replay has no data.
            log.warning("policy.record_inputs: decision inputs are NOT kept: %s", exc)
            inputs = None

    return Services(
        settings=settings,
        verifier=verifier,
        engine=engine,
        admission=admission,
        backends=backends,
        audit=audit,
        store=store,
        approvals=desk,
        reviews=reviews,
        metrics=Metrics(),
        decision_inputs=inputs,
    )


async def _services_ctx(app: web.Application) -> AsyncIterator[None]:
    async with AsyncExitStack() as stack:
        services = await build_services(app[SETTINGS], stack, app.get(TRACERS))
        app[SERVICES] = services
        metrics_live.install(services)  # pools, audit writes, webhook deliveries
        services.tracing = Tracing.from_settings(app[SETTINGS].telemetry)
        stack.callback(services.tracing.shutdown)
        app[PIPELINE] = Pipeline(services)
        services.approvals.attach(app[PIPELINE].run)
        app[admin_api.SELFTEST] = selftest = SelfTest(services)
        selftest.start()
        try:
            yield
        finally:
            await selftest.stop()


async def freeze_startup_heap(app: web.Application) -> None:
    """For a process that serves one gateway (`execgate serve`), after everything has
    started: what start-up made (the policy engine, settings, routes, pools) lives as
    long as the process, so it is moved out of the cyclic collector's reach. A full
    collection walked all of it (~100,000 objects): 61 ms, a request stalled for that
    long about once in 1,000 (measured on the no-op backend). Not in `create_app`: a
    process that makes and drops many apps (tests) would keep each one's garbage."""
    gc.collect()
    gc.freeze()


def create_app(settings: Settings, *, tracers: TracerHub | None = None) -> web.Application:
    """The gateway. `tracers`: a host tracer hub the caller owns and closes, shared with
    other gateways in the process (tests: the kernel tracer attaches in ~14 s and
    detaches in ~20 s); by default the gateway makes and closes its own."""
    app = web.Application(
        middlewares=[error_middleware],
        client_max_size=settings.server.max_body_bytes,
        # Bodies stay as they arrived: a proxy route forwards exactly the bytes and
        # length it received (decoding here while forwarding the caller's
        # Content-Length let a compressed body smuggle a request to the upstream);
        # gateway endpoints decode in gateway/content_coding.py, bounded.
        handler_args={"auto_decompress": False},
    )
    app[SETTINGS] = settings
    if tracers is not None:
        app[TRACERS] = tracers
    app[OPENAPI] = openapi_document()
    app.cleanup_ctx.append(_services_ctx)
    app.add_routes(ops_routes)
    app.add_routes(rest.routes)
    app.add_routes(audit_api.routes)
    app.add_routes(approvals_api.routes)
    app.add_routes(toolcalls.routes)
    if settings.ingress.mcp.enabled:
        app.cleanup_ctx.append(mcp_api.mcp_ctx)
        app.add_routes(mcp_api.routes)
    app.add_routes(admin_api.routes)
    add_console(app)
    # Last: reverse-proxied prefixes (ingress.routes) never shadow a gateway route.
    proxy_api.add_routes(app, settings)
    return app
