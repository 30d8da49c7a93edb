"""The approval desk: holds executions for a person, tells them, takes their answer.

hold -> record + `approval.requested` + webhook delivery (retried, each attempt
audited) -> decide (JWT approver or signed callback) -> an approval token, and the
held execution run once through the same pipeline. Approvals expire on time, also
across restarts (the store is persistent and the expiry sweep runs at start).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import aiohttp

from gateway.approvals import binding as approval_binding
from gateway.approvals.records import Approval, ApprovalRecords, DecisionWord, iso
from gateway.approvals.tokens import ApprovalGrant, ApprovalSigner, load_or_create_signing_key
from gateway.approvals.webhooks import load_secret, post_once
from gateway.audit.log import AuditLog
from gateway.auth.tokens import Principal
from gateway.context import ExecContext, new_id
from gateway.decoders import decode_json_body
from gateway.errors import GatewayError
from gateway.executions.store import ExecutionStore
from gateway.settings.model import ApprovalsSettings
from gateway.state.base import LimitState
from gateway.state.memory import MemoryState

log = logging.getLogger(__name__)

Runner = Callable[[ExecContext], Awaitable[ExecContext]]
_NO_RECORD_IDS = {"request_id": None, "subject": None}


class ApprovalDesk:
    def __init__(
        self,
        settings: ApprovalsSettings,
        store: ApprovalRecords,
        audit: AuditLog,
        executions: ExecutionStore,
        clock: Callable[[], float] = time.time,
        callbacks: LimitState | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.audit = audit
        self.executions = executions
        self._clock = clock
        # Where webhook ids of decision callbacks are remembered: the shared state
        # (Redis: every replica sees every id), in-process for one gateway.
        self._callbacks: LimitState = callbacks if callbacks is not None else MemoryState()
        self.signer: ApprovalSigner | None = None
        self._webhook_key: bytes | None = None
        self.callback_key: bytes | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: Runner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        s = self.settings
        key = await asyncio.to_thread(load_or_create_signing_key, Path(s.signing_key_file))
        self.signer = ApprovalSigner(key, clock=self._clock)
        if s.webhook_secret_file:
            self._webhook_key = await asyncio.to_thread(load_secret, Path(s.webhook_secret_file))
        if s.callback_secret_file:
            self.callback_key = await asyncio.to_thread(load_secret, Path(s.callback_secret_file))
        if s.webhook_url:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=s.delivery_timeout_s)
            )
        await self._expire()
        # Deliveries a restart interrupted go out again (same webhook-id: receivers dedupe).
        for approval in await self.store.list(status="pending", limit=10_000):
            if approval.delivery.get("status") in ("pending", "retrying"):
                self._spawn(self._deliver(approval))
        self._sweeper = asyncio.create_task(self._sweep())

    def attach(self, runner: Runner) -> None:
        """The pipeline that runs approved executions (built after the desk)."""
        self._runner = runner

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(
            *self._tasks, *(t for t in [self._sweeper] if t), return_exceptions=True
        )
        if self._session is not None:
            await self._session.close()

    async def get(self, approval_id: str) -> Approval | None:
        """The approval as it stands now: one past its expiry reads expired (and is
        recorded so) even before the next sweep."""
        approval = await self.store.get(approval_id)
        due = approval is not None and approval.status == "pending"
        if due and approval is not None and self._clock() >= approval.expires_at:
            await self._expire()
            approval = await self.store.get(approval_id)
        return approval

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- holding ---------------------------------------------------------------------

    async def hold(self, ctx: ExecContext, reasons: list[str], ttl_s: int | None) -> Approval:
        assert ctx.principal is not None and ctx.request is not None
        assert ctx.policy_input is not None
        now = self._clock()
        ttl = min(ttl_s or self.settings.ttl_s, self.settings.ttl_s)
        principal = ctx.principal
        approval = Approval(
            id=new_id("apr"),
            tenant=principal.tenant,
            requester=principal.sub,
            execution_id=ctx.execution_id,
            principal={
                "sub": principal.sub,
                "tenant": principal.tenant,
                "scopes": sorted(principal.scopes),
                "claims": principal.claims,
            },
            request=ctx.request.model_dump(mode="json", exclude={"approval_token"}),
            language=ctx.request.language,
            code_sha256=ctx.policy_input["execution"]["code_sha256"],
            features=list(ctx.policy_input["analysis"].get("features", [])),
            reasons=reasons,
            created_at=now,
            # Whole seconds: the expiry the API shows (ISO, to the second) is the real one.
            expires_at=float(math.ceil(now + ttl)),
            delivery={"status": "pending" if self.settings.webhook_url else "not_configured"},
            binding=approval_binding.of(ctx),
            backend=ctx.backend,
            tool=approval_binding.tool_of(ctx),
        )
        await self.store.create(approval)
        self.executions.held(ctx.execution_id, approval.tenant, self._summary(approval))
        if self.settings.webhook_url:
            self._spawn(self._deliver(approval))
        return approval

    @staticmethod
    def _summary(approval: Approval) -> dict[str, Any]:
        return {"approval_id": approval.id, "expires_at": iso(approval.expires_at)}

    # --- delivery ----------------------------------------------------------------------

    def payload(self, approval: Approval) -> dict[str, Any]:
        base = self.settings.public_url.rstrip("/")
        data = approval.public()
        data["links"] = {
            "approval": f"{base}/v1/approvals/{approval.id}",
            "decision": f"{base}/v1/approvals/{approval.id}/decision",
            "execution": f"{base}/v1/executions/{approval.execution_id}",
        }
        return {"type": "approval.requested", "timestamp": iso(self._clock()), "data": data}

    async def _deliver(self, approval: Approval) -> None:
        s = self.settings
        assert self._session is not None
        body = json.dumps(self.payload(approval)).encode()
        key = self._webhook_key or b""
        for attempt in range(1, s.delivery_attempts + 1):
            current = await self.store.get(approval.id)
            if current is None or current.status != "pending":
                return  # decided or expired meanwhile: nobody needs telling
            ok, retry, outcome = await post_once(
                self._session, s.webhook_url, key, approval.id, body
            )
            outcome = {"attempt": attempt, **outcome}
            final = ok or not retry or attempt == s.delivery_attempts
            await self.audit.append(
                "approval.delivered",
                **_NO_RECORD_IDS,
                execution_id=approval.execution_id,
                tenant=approval.tenant,
                approval_id=approval.id,
                delivered=ok,
                final=final,
                **outcome,
            )
            if ok:
                await self.store.update(approval.id, delivery={"status": "delivered", **outcome})
                return
            if final:
                log.warning(
                    "approval %s: webhook delivery failed for good: %s", approval.id, outcome
                )
                await self.store.update(
                    approval.id,
                    delivery={
                        "status": "failed",
                        **outcome,
                        "note": "never delivered; pending until it expires",
                    },
                )
                return
            await self.store.update(approval.id, delivery={"status": "retrying", **outcome})
            cap = min(s.backoff_max_s, s.backoff_initial_s * 2 ** (attempt - 1))
            await asyncio.sleep(random.uniform(cap / 2, cap))  # jittered exponential

    # --- deciding ------------------------------------------------------------------

    async def claim_callback(
        self, webhook_id: str, approval_id: str, body: bytes
    ) -> Literal["new", "duplicate", "reused"]:
        """Spend a verified callback's webhook id: "new" the first time, "duplicate"
        for the same message again, "reused" for the id on another body or approval.
        Raises StateUnavailable."""
        fingerprint = hashlib.sha256(approval_id.encode() + b"\n" + body).hexdigest()
        # A timestamp verifies from `tolerance` before now to `tolerance` after it:
        # the id is remembered for as long as any copy of the message could verify.
        ttl_s = 2 * self.settings.callback_tolerance_s + 60
        held = await self._callbacks.claim_once(f"webhook:{webhook_id}", fingerprint, ttl_s)
        if held is None:
            return "new"
        return "duplicate" if held == fingerprint else "reused"

    async def decide(
        self,
        approval_id: str,
        word: DecisionWord,
        approver: str,
        reason: str,
        via: str,
        **audit: Any,
    ) -> tuple[Approval, str | None]:
        """Record a decision; on approval mint a token and (run_held) run the execution."""
        approval, changed = await self.store.decide(approval_id, word, approver, reason)
        if not changed:
            return approval, None
        await self.audit.append(
            "approval.decided",
            request_id=None,
            execution_id=approval.execution_id,
            tenant=approval.tenant,
            subject=approver,
            approval_id=approval.id,
            decision=word,
            approver=approver,
            reason=reason,
            via=via,
            requester=approval.requester,
            **audit,
        )
        if word == "deny":
            await self.executions.settle(
                approval.execution_id,
                "failed",
                {"code": "approval_denied", "message": reason or "denied by an approver"},
            )
            return approval, None
        token = self.mint(approval)
        # A held upstream tool call (language "tool", gateway/stages/tool.py) has no
        # sandbox run: its caller presents the token when it calls the tool again.
        if self.settings.run_held and approval.language != "tool":
            self._spawn(self.run_held(approval, token))
        return approval, token

    def mint(self, approval: Approval) -> str:
        assert self.signer is not None
        limits = {k: v for k, v in approval.request.get("limits", {}).items() if v is not None}
        token, _ = self.signer.mint(
            approval_id=approval.id,
            tenant=approval.tenant,
            requester=approval.requester,
            approver=approval.approver or "",
            code_sha256=approval.code_sha256,
            limits=limits,
            egress=list(approval.request.get("network", {}).get("egress", [])),
            # An approval held before bindings existed has none: its token redeems nothing.
            binding=approval.binding,
            ttl_s=max(approval.expires_at - self._clock(), 60),
        )
        return token

    async def run_held(self, approval: Approval, token: str) -> None:
        """Run the held request once, as its requester, through the whole pipeline."""
        assert self._runner is not None
        p = approval.principal
        principal: Principal = Principal(p["sub"], p["tenant"], frozenset(p["scopes"]), p["claims"])
        body = dict(approval.request, approval_token=token)
        ctx = ExecContext(
            ingress="approval",
            source_ip="",
            bearer=None,
            payload=json.dumps(body).encode(),
            decode=decode_json_body,
            execution_id=approval.execution_id,
        )
        ctx.principal = principal  # authenticated when the request was made
        try:
            await self._runner(ctx)
        except GatewayError as exc:  # the pipeline audited it; the record shows it too
            await self.executions.settle(approval.execution_id, "failed", exc.body()["error"])
        except Exception as exc:
            log.exception("held execution %s failed", approval.execution_id)
            await self.executions.settle(
                approval.execution_id, "failed", {"code": "internal_error", "message": str(exc)}
            )

    # --- presented tokens ----------------------------------------------------------

    async def redeem(self, grant: ApprovalGrant) -> Approval:
        """Spend a verified token: its jti once, and its approval once (-> executed)."""
        approval = await self.store.get(grant.approval_id)
        if approval is None:
            raise LookupError("no such approval")
        if approval.status != "approved":
            raise PermissionError(f"approval is {approval.status}")
        if not await self.store.spend_token(grant.jti, grant.expires_at):
            raise PermissionError("token already used")
        # Once per approval too, however many tokens name it.
        if not await self.store.spend_token(f"approval:{approval.id}", grant.expires_at):
            raise PermissionError("approval already used")
        updated = await self.store.update(approval.id, status="executed")
        assert updated is not None
        return updated

    # --- expiry --------------------------------------------------------------------------

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.settings.expiry_check_s)
            try:
                await self._expire()
            except Exception:
                log.exception("approval expiry sweep failed")

    async def _expire(self) -> None:
        for approval in await self.store.expire_due():
            await self.audit.append(
                "approval.expired",
                **_NO_RECORD_IDS,
                execution_id=approval.execution_id,
                tenant=approval.tenant,
                approval_id=approval.id,
                delivery=approval.delivery.get("status"),
            )
            await self.executions.settle(
                approval.execution_id,
                "failed",
                {"code": "approval_expired", "message": "no decision before the approval expired"},
            )


def principal_may_read(principal: Principal, approval: Approval) -> bool:
    if "approvals:read:all" in principal.scopes:
        return True
    if principal.tenant != approval.tenant:
        return False
    return "approvals:read" in principal.scopes or principal.sub == approval.requester
