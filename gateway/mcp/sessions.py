"""MCP sessions of the 2025-11-25 revision: opened by `initialize`, named by an
unguessable `MCP-Session-Id`, bound to the principal that opened them, ended by
DELETE or by idleness. In memory: a restarted gateway answers 404 and the client
opens a new session, as the protocol expects.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.auth.tokens import Principal


@dataclass
class McpSession:
    id: str
    tenant: str
    subject: str
    version: str
    last_used: float = field(default_factory=time.monotonic)


class McpSessions:
    def __init__(
        self, max_sessions: int, idle_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._clock = clock
        self._sessions: dict[str, McpSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, principal: Principal, version: str) -> McpSession:
        self._expire()
        if len(self._sessions) >= self.max_sessions:
            # The least recently used goes: a flood of initializes cannot grow memory.
            oldest = min(self._sessions.values(), key=lambda s: s.last_used)
            del self._sessions[oldest.id]
        session = McpSession(
            id=secrets.token_urlsafe(24),
            tenant=principal.tenant,
            subject=principal.sub,
            version=version,
            last_used=self._clock(),
        )
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str, principal: Principal) -> McpSession | None:
        """The session if it exists, is live and belongs to this principal."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.last_used > self.idle_s:
            del self._sessions[session_id]
            return None
        # Another principal's session is indistinguishable from a missing one.
        if (session.tenant, session.subject) != (principal.tenant, principal.sub):
            return None
        session.last_used = now
        return session

    def end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def _expire(self) -> None:
        now = self._clock()
        for sid in [s.id for s in self._sessions.values() if now - s.last_used > self.idle_s]:
            del self._sessions[sid]
