"""The escape suite in production: on a schedule or on demand, against the live
backends, one probe at a time (serving goes on beside it).

Each run is audited (`sandbox.selftest`) and counted in metrics; a backend that
is not sound (any escape, any technique the suite could not judge, more not
applicable than its ceiling: runner.py) is taken out of service (`/readyz` says
why, executions routed to it are refused with 503 backend_unavailable) until an
operator clears it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from gateway.escape.runner import SuiteResult, run_suite
from gateway.escape.technique import Outcome
from gateway.services import Services

log = logging.getLogger(__name__)


class SelfTest:
    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.outcomes = Counter(
            "execgate_selftest_techniques_total",
            "Escape self-test techniques by backend and outcome",
            ["backend", "outcome"],
            registry=svc.metrics.registry,
        )
        # One suite at a time: a second request waits rather than doubling the load.
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._key_file = str(Path(svc.settings.auth.hs256_secret_file).absolute())

    async def run(self, names: list[str]) -> list[SuiteResult]:
        results = []
        async with self._lock:
            for name in names:
                results.append(await self._run_one(name))
        return results

    async def _run_one(self, name: str) -> SuiteResult:
        result = await run_suite(self.svc.backends[name], credential_files=(self._key_file,))
        for outcome in Outcome:
            self.outcomes.labels(name, outcome.value).inc(result.count(outcome))
        problems = result.problems
        escaped = [f.technique.id for f in result.escaped]
        if problems:
            # Not sound is out of service: an escape, and as much a run the suite
            # could not judge (a backend that fails runs, probes that never ran).
            self.svc.out_of_service[name] = f"escape self-test: {'; '.join(problems)}"
            # The why, not only the which: an operator acts on the detail.
            details = {f.technique.id: f.verdict.detail for f in result.escaped + result.errors}
            log.error("backend %s taken out of service: %s %s", name, problems, details)
        await self.svc.audit.append(
            "sandbox.selftest",
            backend=name,
            counts={o.value: result.count(o) for o in Outcome},
            escaped=escaped,
            escaped_details={f.technique.id: f.verdict.detail for f in result.escaped},
            errors={f.technique.id: f.verdict.detail for f in result.errors},
            problems=problems,
            sound=not problems,
            duration_ms=result.duration_ms,
            out_of_service=bool(problems),
        )
        return result

    async def clear(self, name: str, subject: str) -> dict[str, Any]:
        reason = self.svc.out_of_service.pop(name, None)
        await self.svc.audit.append(
            "sandbox.cleared", backend=name, subject=subject, was=reason or ""
        )
        return {"backend": name, "cleared": reason is not None, "was": reason}

    def start(self) -> None:
        interval = self.svc.settings.escape_test.interval_s
        if interval > 0:
            self._task = asyncio.ensure_future(self._periodically(interval))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _periodically(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.run(list(self.svc.backends))
            except Exception:  # the schedule survives one bad run; the log says why
                log.exception("escape self-test failed")
