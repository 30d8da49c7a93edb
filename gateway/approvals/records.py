"""Approval records: the held execution, who asked, who decided, and what happened.

Persistent (SQLite at `state.path`) so pending approvals survive a restart and
expire on time even across one. Every change is one conditional UPDATE, so two
deciders racing cannot both win, and a single-use token id can be spent once.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from gateway.files import make_private_dirs

Status = Literal["pending", "approved", "denied", "expired", "executed"]
DecisionWord = Literal["approve", "deny"]
_DECIDED = {"approve": "approved", "deny": "denied"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,
    expires_at REAL NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS approvals_status ON approvals (status, expires_at);
CREATE TABLE IF NOT EXISTS spent_tokens (
    jti TEXT PRIMARY KEY,
    expires_at REAL NOT NULL
);
"""


# Approvers see an input file or stdin inline when it is text of at most this many
# bytes; anything else by its sha256 and size (the binding holds it to those bytes).
SHOW_INLINE_BYTES = 16 * 1024
# ...and at most this much inline per approval (stdin first, then files in order), so
# a listing of many approvals with many files stays a bounded answer.
SHOW_TOTAL_BYTES = 64 * 1024


def shown(content: bytes, limit: int = SHOW_INLINE_BYTES) -> dict[str, Any]:
    """{"bytes", "sha256", "content"}: content is the text, or null when not shown."""
    text: str | None = None
    if len(content) <= min(limit, SHOW_INLINE_BYTES):
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and "\x00" in text:
            text = None
    return {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest(), "content": text}


def _file_bytes(entry: dict[str, Any]) -> bytes:
    try:
        return base64.b64decode(entry.get("content_b64", ""), validate=True)
    except (binascii.Error, ValueError):
        return b""  # validated when held; a damaged record shows as empty, never a 500


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Approval:
    id: str
    tenant: str
    requester: str
    execution_id: str
    # The authenticated caller, so the held execution runs as them (never a token).
    principal: dict[str, Any]
    # The held request body, exactly as validated (code, files, limits, egress...).
    request: dict[str, Any]
    language: str
    code_sha256: str
    features: list[str]
    reasons: list[str]
    created_at: float
    expires_at: float
    status: Status = "pending"
    decided_at: float | None = None
    approver: str | None = None
    decision_reason: str = ""
    delivery: dict[str, Any] = field(default_factory=lambda: {"status": "not_configured"})
    result_status: str | None = None
    # What the approval binds (gateway/approvals/binding.py, sealed when held), and the
    # backend and guarded tool it binds, for approvers to read.
    binding: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None
    tool: dict[str, Any] | None = None

    def inputs(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Every input file ({"path", "bytes", "sha256", "content"}) and stdin, as shown."""
        stdin = shown(str(self.request.get("stdin", "")).encode("utf-8"))
        budget = SHOW_TOTAL_BYTES - (stdin["bytes"] if stdin["content"] is not None else 0)
        files = []
        for entry in self.request.get("files", []):
            item = shown(_file_bytes(entry), budget)
            if item["content"] is not None:
                budget -= item["bytes"]
            files.append({"path": entry["path"], **item})
        return files, stdin

    def public(self) -> dict[str, Any]:
        """What the API and the webhook show: what will run (files small enough to read
        inline, others by hash and size; stdin likewise), never a token."""
        files, stdin = self.inputs()
        return {
            "approval_id": self.id,
            "tenant": self.tenant,
            "requester": self.requester,
            "execution_id": self.execution_id,
            "status": self.status,
            "language": self.language,
            "code": self.request.get("code", ""),
            "code_sha256": self.code_sha256,
            "files": files,
            "stdin": stdin,
            "backend": self.backend,
            "tool": self.tool,
            "binding_sha256": self.binding.get("sha256"),
            "features": self.features,
            "reasons": self.reasons,
            "limits": self.request.get("limits", {}),
            "egress": self.request.get("network", {}).get("egress", []),
            "created_at": iso(self.created_at),
            "expires_at": iso(self.expires_at),
            "decided_at": iso(self.decided_at),
            "approver": self.approver,
            "decision_reason": self.decision_reason,
            "delivery": self.delivery,
            "result_status": self.result_status,
        }


class ApprovalError(Exception):
    def __init__(self, kind: Literal["not_found", "expired", "conflict"], message: str) -> None:
        super().__init__(message)
        self.kind = kind


class ApprovalRecords(Protocol):
    """What the approval desk needs of a store; a shared store (Redis) implements it too."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def create(self, approval: Approval) -> None: ...
    async def get(self, approval_id: str) -> Approval | None: ...
    async def decide(
        self, approval_id: str, word: DecisionWord, approver: str, reason: str
    ) -> tuple[Approval, bool]: ...
    async def update(self, approval_id: str, **changes: Any) -> Approval | None: ...
    async def expire_due(self) -> list[Approval]: ...
    async def list(
        self, status: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[Approval]: ...
    async def spend_token(self, jti: str, expires_at: float) -> bool: ...


class ApprovalStore:
    """ApprovalRecords in SQLite (the default, embedded)."""

    def __init__(self, path: Path, clock: Any = time.time) -> None:
        self._path = path
        self._clock = clock
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="execgate-approvals")

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def start(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        make_private_dirs(self._path.parent)
        db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        # Approvals and spent token ids must survive a crash: full sync.
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        self._db = db

    async def close(self) -> None:
        if self._db is not None:
            await self._call(self._db.close)
            self._db = None
        self._thread.shutdown(wait=True)

    # --- one thread owns the connection; these run there ---------------------------

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("approval store is not open")
        return self._db

    def _put(self, approval: Approval) -> None:
        self._conn().execute(
            "INSERT OR REPLACE INTO approvals (id, tenant, status, expires_at, record) "
            "VALUES (?, ?, ?, ?, ?)",
            (
                approval.id,
                approval.tenant,
                approval.status,
                approval.expires_at,
                json.dumps(asdict(approval)),
            ),
        )

    def _get(self, approval_id: str) -> Approval | None:
        row = (
            self._conn()
            .execute("SELECT record FROM approvals WHERE id = ?", (approval_id,))
            .fetchone()
        )
        return Approval(**json.loads(row[0])) if row else None

    def _decide(
        self, approval_id: str, word: DecisionWord, approver: str, reason: str
    ) -> tuple[Approval, bool]:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            approval = self._get(approval_id)
            if approval is None:
                raise ApprovalError("not_found", "no such approval")
            target = _DECIDED[word]
            now = self._clock()
            if approval.status == "pending" and now >= approval.expires_at:
                approval.status = "expired"
                self._put(approval)
            if approval.status == "expired":
                db.execute("COMMIT")
                raise ApprovalError("expired", "the approval has expired")
            if approval.status != "pending":
                done = "approved" if approval.status == "executed" else approval.status
                db.execute("COMMIT")
                if done == target:
                    return approval, False  # the same decision again: idempotent
                raise ApprovalError("conflict", f"already {approval.status}")
            approval.status = target  # type: ignore[assignment]
            approval.decided_at, approval.approver = now, approver
            approval.decision_reason = reason
            self._put(approval)
            db.execute("COMMIT")
            return approval, True
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _update(self, approval_id: str, changes: dict[str, Any]) -> Approval | None:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            approval = self._get(approval_id)
            if approval is not None:
                for key, value in changes.items():
                    setattr(approval, key, value)
                self._put(approval)
            db.execute("COMMIT")
            return approval
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _expire_due(self) -> list[Approval]:
        db = self._conn()
        now = self._clock()
        rows = db.execute(
            "SELECT id FROM approvals WHERE status = 'pending' AND expires_at <= ?", (now,)
        ).fetchall()
        expired = []
        for (approval_id,) in rows:
            approval = self._update(approval_id, {"status": "expired"})
            if approval is not None:
                expired.append(approval)
        db.execute("DELETE FROM spent_tokens WHERE expires_at <= ?", (now,))
        return expired

    def _list(self, status: str | None, tenant: str | None, limit: int) -> list[Approval]:
        query = "SELECT record FROM approvals WHERE 1=1"
        args: list[Any] = []
        if status:
            query += " AND status = ?"
            args.append(status)
        if tenant:
            query += " AND tenant = ?"
            args.append(tenant)
        query += " ORDER BY rowid DESC LIMIT ?"
        args.append(limit)
        return [Approval(**json.loads(r[0])) for r in self._conn().execute(query, args)]

    def _spend(self, jti: str, expires_at: float) -> bool:
        cur = self._conn().execute(
            "INSERT OR IGNORE INTO spent_tokens (jti, expires_at) VALUES (?, ?)", (jti, expires_at)
        )
        return cur.rowcount == 1

    # --- the async face ----------------------------------------------------------

    async def create(self, approval: Approval) -> None:
        await self._call(self._put, approval)

    async def get(self, approval_id: str) -> Approval | None:
        return await self._call(self._get, approval_id)

    async def decide(
        self, approval_id: str, word: DecisionWord, approver: str, reason: str
    ) -> tuple[Approval, bool]:
        """(approval, changed). Raises ApprovalError: not_found, expired, conflict."""
        return await self._call(self._decide, approval_id, word, approver, reason)

    async def update(self, approval_id: str, **changes: Any) -> Approval | None:
        return await self._call(self._update, approval_id, changes)

    async def expire_due(self) -> list[Approval]:
        return await self._call(self._expire_due)

    async def list(
        self, status: str | None = None, tenant: str | None = None, limit: int = 100
    ) -> list[Approval]:
        return await self._call(self._list, status, tenant, limit)

    async def spend_token(self, jti: str, expires_at: float) -> bool:
        """True once per jti: the first presentation of a single-use token."""
        return await self._call(self._spend, jti, expires_at)
