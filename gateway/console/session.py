"""Console sessions: a random id in an HttpOnly cookie, the verified identity on the server.

The pasted JWT is verified once and dropped; a session keeps only what the console
needs to authorise pages (subject, tenant, scopes) and when it ends: at the
token's own `exp`, `MAX_AGE_S` after sign-in, or `IDLE_S` after its last request,
whichever comes first (constants: the console has no settings of its own). The store
keys sessions by the SHA-256 of their id, so the ids themselves are nowhere in memory
after the response that set the cookie. Each session carries its own CSRF token
(synchronizer pattern) for the forms it renders.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from gateway.auth.tokens import Principal

COOKIE = "execgate_console"
COOKIE_PATH = "/console/"
MAX_AGE_S = 30 * 60
# An unattended signed-in browser stops being a way in well before the hard cap.
IDLE_S = 15 * 60
# A cap on live sessions: each needs a valid token, but memory must stay bounded anyway.
MAX_SESSIONS = 10_000

# Scopes that open some page of the console; a token with none of them gets no session.
CONSOLE_SCOPES = frozenset(
    {
        "approvals:read",
        "approvals:read:all",
        "approvals:decide",
        "approvals:decide:all",
        "audit:read",
        "audit:read:all",
    }
)


@dataclass(frozen=True, slots=True)
class Session:
    sub: str
    tenant: str
    scopes: frozenset[str]
    csrf: str
    expires_at: float

    def principal(self) -> Principal:
        """The approver as the approval desk sees them; the token itself is gone."""
        return Principal(self.sub, self.tenant, self.scopes, {"sub": self.sub})

    def has(self, *scopes: str) -> bool:
        return any(s in self.scopes for s in scopes)

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(slots=True)
class _Entry:
    session: Session
    last_seen: float


class SessionStore:
    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        max_age_s: float = MAX_AGE_S,
        idle_s: float = IDLE_S,
    ):
        self._clock = clock
        self._max_age_s = max_age_s
        self._idle_s = idle_s
        # Least recently used first: the cap evicts whoever has been away longest.
        self._sessions: OrderedDict[str, _Entry] = OrderedDict()

    def open(self, principal: Principal) -> tuple[str, Session]:
        """A new session for a verified principal: (cookie value, session)."""
        now = self._clock()
        exp = principal.claims.get("exp")
        ends = now + self._max_age_s
        if isinstance(exp, int | float) and not isinstance(exp, bool):
            ends = min(ends, float(exp))
        session = Session(
            sub=principal.sub,
            tenant=principal.tenant,
            scopes=frozenset(principal.scopes & CONSOLE_SCOPES),
            csrf=secrets.token_urlsafe(32),
            expires_at=ends,
        )
        session_id = secrets.token_urlsafe(32)
        self._sweep(now)
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.popitem(last=False)  # oldest first
        self._sessions[_key(session_id)] = _Entry(session, now)
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session for a cookie value; using it counts as activity."""
        if not session_id:
            return None
        key = _key(session_id)
        entry = self._sessions.get(key)
        if entry is None:
            return None
        now = self._clock()
        if self._ended(entry, now):
            del self._sessions[key]
            return None
        entry.last_seen = now
        self._sessions.move_to_end(key)
        return entry.session

    def close(self, session_id: str | None) -> None:
        if session_id:
            self._sessions.pop(_key(session_id), None)

    def __len__(self) -> int:
        return len(self._sessions)

    def _ended(self, entry: _Entry, now: float) -> bool:
        return now >= entry.session.expires_at or now - entry.last_seen >= self._idle_s

    def _sweep(self, now: float) -> None:
        for key in [k for k, e in self._sessions.items() if self._ended(e, now)]:
            del self._sessions[key]

    def remaining_s(self, session: Session) -> int:
        return max(0, int(session.expires_at - self._clock()))


SESSIONS = web.AppKey("console_sessions", SessionStore)
