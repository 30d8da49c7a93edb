"""Flagged executions to the review webhook, off the request path.

One worker drains a bounded queue: a dead receiver slows nobody's request, and a
flood of flagged executions costs bounded memory (past `max_pending` a delivery
is dropped, and the drop is audited). Each attempt is audited as
`review.delivered`; 5xx, 408, 429 and network errors are retried with jittered
exponential backoff, other answers are final.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.approvals.records import iso
from gateway.approvals.webhooks import load_secret, post_once
from gateway.audit.log import AuditLog
from gateway.context import new_id
from gateway.review.document import Flag
from gateway.settings.model import ReviewSettings

log = logging.getLogger(__name__)

_NO_RECORD_IDS = {"request_id": None, "subject": None}


class ReviewNotifier:
    def __init__(self, settings: ReviewSettings, audit: AuditLog) -> None:
        self.settings = settings
        self.audit = audit
        self._key = b""
        self._session: aiohttp.ClientSession | None = None
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(settings.max_pending)
        self._worker: asyncio.Task[None] | None = None

    @property
    def configured(self) -> bool:
        return bool(self.settings.webhook_url)

    async def start(self) -> None:
        s = self.settings
        if not s.webhook_url:
            return
        if s.webhook_secret_file:
            self._key = await asyncio.to_thread(load_secret, Path(s.webhook_secret_file))
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=s.delivery_timeout_s)
        )
        self._worker = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        if self._session is not None:
            await self._session.close()

    def payload(
        self, execution_id: str, tenant: str, backend: str, flags: list[Flag]
    ) -> dict[str, Any]:
        base = self.settings.public_url.rstrip("/")
        return {
            "type": "execution.flagged",
            "timestamp": iso(time.time()),
            "data": {
                "execution_id": execution_id,
                "tenant": tenant,
                "backend": backend,
                "flags": [f.as_dict() for f in flags],
                "execution": f"{base}/v1/executions/{execution_id}",
                "story": f"{base}/console/executions/{execution_id}",
            },
        }

    async def notify(self, execution_id: str, tenant: str, backend: str, flags: list[Flag]) -> None:
        """Queue one delivery (never waits for the receiver)."""
        if self._worker is None or not flags:
            return
        message = {
            "id": new_id("rev"),
            "execution_id": execution_id,
            "tenant": tenant,
            "body": json.dumps(self.payload(execution_id, tenant, backend, flags)).encode(),
        }
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            log.warning("review webhook: %d deliveries waiting; dropping one", self._queue.qsize())
            await self.audit.append(
                "review.delivered", **_NO_RECORD_IDS, execution_id=execution_id, tenant=tenant,
                webhook_id=message["id"], delivered=False, final=True,
                error=f"dropped: {self.settings.max_pending} deliveries already waiting",
            )  # fmt: skip

    async def _run(self) -> None:
        while True:
            message = await self._queue.get()
            try:
                await self._deliver(message)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("review webhook delivery failed")

    async def _deliver(self, message: dict[str, Any]) -> None:
        s = self.settings
        assert self._session is not None
        body: bytes = message["body"]
        for attempt in range(1, s.delivery_attempts + 1):
            ok, retry, outcome = await post_once(
                self._session, s.webhook_url, self._key, message["id"], body
            )
            outcome = {"attempt": attempt, **outcome}
            final = ok or not retry or attempt == s.delivery_attempts
            await self.audit.append(
                "review.delivered", **_NO_RECORD_IDS, execution_id=message["execution_id"],
                tenant=message["tenant"], webhook_id=message["id"], delivered=ok, final=final,
                **outcome,
            )  # fmt: skip
            if final:
                return
            cap = min(s.backoff_max_s, s.backoff_initial_s * 2 ** (attempt - 1))
            await asyncio.sleep(random.uniform(cap / 2, cap))
