"""Hot reload for the embedded engine: recompile when the policy directory changes.

Every `interval_s` the reloader hashes the policy files (the same content hash
the engine reports as its revision; no parsing, a few small reads). When the
hash differs from the engine's revision it calls `engine.start()`, which
compiles the new policy off to the side and swaps it in only once it is ready:

- success: the audit log gets `policy.reloaded` with the old and new revision;
- failure: the engine keeps serving the policy it has, the error is logged at
  ERROR and audited as `policy.reload_failed` with the revision in force and
  the one refused. The same broken content is not retried (or re-audited) on
  every tick, only once it changes again.

The OPA engine needs none of this: OPA polls its bundle service and activates
new bundles itself (deploy/opa/config.yaml); each answer names its revision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Protocol

from gateway.policy.base import PolicyEngineError
from gateway.policy.sources import fingerprint

log = logging.getLogger(__name__)


class Restartable(Protocol):
    revision: str

    async def start(self) -> None: ...


class Recorder(Protocol):
    async def append(self, type: str, **fields: Any) -> dict[str, Any]: ...


class PolicyReloader:
    def __init__(self, engine: Restartable, path: Path, audit: Recorder, interval_s: float) -> None:
        self._engine = engine
        self._path = path
        self._audit = audit
        self._interval_s = interval_s
        self._refused = ""  # content already tried and refused
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="policy-reload")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.check()
            except Exception:  # the reloader must outlive any one bad tick
                log.exception("policy reload check failed")

    async def check(self) -> bool:
        """Reload if the files changed; True when a new policy is now in force."""
        old = self._engine.revision
        try:
            seen: str | None = await asyncio.to_thread(fingerprint, self._path)
        except PolicyEngineError as exc:  # e.g. the directory is gone
            seen, error, tried = None, exc, f"unreadable: {exc}"
        else:
            if seen == old:
                self._refused = ""
                return False
            tried = seen
            if tried == self._refused:
                return False
            try:
                await self._engine.start()
            except PolicyEngineError as exc:
                error = exc
            else:
                self._refused = ""
                new = self._engine.revision
                log.info("policy reloaded: revision %s -> %s", old[:12], new[:12])
                await self._record("policy.reloaded", old_revision=old, new_revision=new)
                return True
        if tried == self._refused:
            return False
        self._refused = tried
        log.error(
            "POLICY RELOAD FAILED: still serving revision %s; the policy in %s is not used: %s",
            old[:12],
            self._path,
            error,
        )
        await self._record(
            "policy.reload_failed", revision=old, refused_revision=seen, error=str(error)
        )
        return False

    async def _record(self, type: str, **fields: Any) -> None:
        await self._audit.append(
            type, request_id=None, execution_id=None, tenant=None, subject=None, **fields
        )
