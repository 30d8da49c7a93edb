"""Recovery: executions a killed predecessor started but never finished get an end.

A SIGKILLed gateway leaves `execution.started` records with no terminal record and
no execution record on disk. At start-up, before `gateway.started`, the audit log
(the durable truth) is read backwards from its end to the last `gateway.started`
or `gateway.stopped`: every start recovers before it writes `gateway.started`, and
a clean stop ends its executions itself, so nothing older needs looking at. Each
execution found is ended twice over: its execution record (`failed`, code
`execution_lost`) first, then `execution.finished` with `status: lost` - in that
order, so a crash in between leaves it to be found again, never half-ended.
"""

from __future__ import annotations

import asyncio
import logging
from os import PathLike
from typing import Any

from gateway.audit.log import AuditLog
from gateway.audit.read import decode_line
from gateway.audit.reverse import BLOCK, lines_newest_first
from gateway.executions.store import ExecutionStore

log = logging.getLogger(__name__)

LOST_REASON = "gateway stopped before the execution finished"
LOST_ERROR = {"code": "execution_lost", "message": LOST_REASON}
# What the pipeline writes when an execution it started ends (dispatch, or its error record).
TERMINAL_TYPES = frozenset(
    {"execution.finished", "request.rejected", "rate.limited", "auth.failed"}
)
_BOUNDARIES = (b'"type":"gateway.started"', b'"type":"gateway.stopped"')


def unfinished_sync(path: str | PathLike[str], block_bytes: int = BLOCK) -> list[dict[str, Any]]:
    """`execution.started` records since the last run boundary with no terminal record
    after them, oldest first (blocking)."""
    ended: set[str] = set()
    lost: list[dict[str, Any]] = []
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return []
    with f:
        for _, raw in lines_newest_first(f, block_size=block_bytes):
            boundary = any(needle in raw for needle in _BOUNDARIES)
            if not boundary and b'"execution_id":null' in raw:
                continue  # neither a boundary nor about an execution: skip the parse
            try:
                record = decode_line(raw)
            except ValueError as exc:
                log.warning("recovery: audit line skipped: %s", exc)
                continue
            if record.get("type") in ("gateway.started", "gateway.stopped"):
                break
            execution_id = record.get("execution_id")
            if not isinstance(execution_id, str):
                continue
            if record.get("type") in TERMINAL_TYPES:
                ended.add(execution_id)
            elif record.get("type") == "execution.started" and execution_id not in ended:
                ended.add(execution_id)
                lost.append(record)
    lost.reverse()
    return lost


async def recover(audit: AuditLog, store: ExecutionStore) -> list[str]:
    """End every execution the previous run left unfinished; their ids."""
    lost = await asyncio.to_thread(unfinished_sync, audit.path)
    for started in lost:
        execution_id = started["execution_id"]
        log.warning("execution %s was lost: %s", execution_id, LOST_REASON)
        await store.lost(execution_id, started["tenant"], started["ts"], LOST_ERROR)
        await audit.append(
            "execution.finished",
            request_id=started.get("request_id"),
            execution_id=execution_id,
            tenant=started.get("tenant"),
            subject=started.get("subject"),
            backend=started.get("backend"),
            status="lost",
            reason=LOST_REASON,
        )
    return [started["execution_id"] for started in lost]
