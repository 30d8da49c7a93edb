"""Every error the gateway can answer with: a stable code, an HTTP status, an audit outcome.

Stages raise `GatewayError`; the edge renders it as `{"error": {...}}` (or in the
caller's protocol) and the recorder writes its `outcome` to the audit log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ErrorKind:
    code: str
    status: int
    outcome: str  # audit outcome word


INVALID_REQUEST = ErrorKind("invalid_request", 400, "rejected")
UNAUTHENTICATED = ErrorKind("unauthenticated", 401, "auth_failed")
FORBIDDEN = ErrorKind("forbidden", 403, "forbidden")
POLICY_DENIED = ErrorKind("policy_denied", 403, "denied")
NOT_FOUND = ErrorKind("not_found", 404, "not_found")
METHOD_NOT_ALLOWED = ErrorKind("method_not_allowed", 405, "rejected")
UNSUPPORTED_MEDIA_TYPE = ErrorKind("unsupported_media_type", 415, "rejected")
CONFLICT = ErrorKind("conflict", 409, "rejected")
APPROVAL_EXPIRED = ErrorKind("approval_expired", 409, "rejected")
APPROVAL_INVALID = ErrorKind("approval_invalid", 403, "approval_refused")
TOO_LARGE = ErrorKind("too_large", 413, "rejected")
RATE_LIMITED = ErrorKind("rate_limited", 429, "rate_limited")
QUOTA_EXCEEDED = ErrorKind("quota_exceeded", 429, "rate_limited")
POLICY_UNAVAILABLE = ErrorKind("policy_unavailable", 503, "policy_error")
POLICY_INVALID = ErrorKind("policy_invalid", 503, "policy_error")
BACKEND_UNAVAILABLE = ErrorKind("backend_unavailable", 503, "backend_error")
AUDIT_UNAVAILABLE = ErrorKind("audit_unavailable", 503, "audit_error")
# Shared limit state (Redis) unreachable: nothing is admitted (fail closed).
STATE_UNAVAILABLE = ErrorKind("state_unavailable", 503, "state_error")
# No global execution slot came free within admission.queue_timeout_s.
QUEUE_TIMEOUT = ErrorKind("queue_timeout", 503, "rate_limited")
# A reverse-proxy route's or the MCP endpoint's upstream: refused or broken (502), too slow (504).
UPSTREAM_UNAVAILABLE = ErrorKind("upstream_unavailable", 502, "upstream_error")
UPSTREAM_TIMEOUT = ErrorKind("upstream_timeout", 504, "upstream_error")
INTERNAL = ErrorKind("internal_error", 500, "error")

ALL_KINDS: tuple[ErrorKind, ...] = (
    INVALID_REQUEST,
    UNAUTHENTICATED,
    FORBIDDEN,
    POLICY_DENIED,
    NOT_FOUND,
    METHOD_NOT_ALLOWED,
    UNSUPPORTED_MEDIA_TYPE,
    CONFLICT,
    APPROVAL_EXPIRED,
    APPROVAL_INVALID,
    TOO_LARGE,
    RATE_LIMITED,
    QUOTA_EXCEEDED,
    POLICY_UNAVAILABLE,
    POLICY_INVALID,
    BACKEND_UNAVAILABLE,
    AUDIT_UNAVAILABLE,
    STATE_UNAVAILABLE,
    QUEUE_TIMEOUT,
    UPSTREAM_UNAVAILABLE,
    UPSTREAM_TIMEOUT,
    INTERNAL,
)


class GatewayError(Exception):
    """An outcome that stops the pipeline. `extra` joins `error` in the JSON body."""

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    @property
    def code(self) -> str:
        return self.kind.code

    @property
    def status(self) -> int:
        return self.kind.status

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.kind.code, "message": self.message, **self.extra}}


def invalid_field(field: str, message: str) -> GatewayError:
    """A 400 that names the one bad field, in the same shape as model validation."""
    return GatewayError(
        INVALID_REQUEST, f"{field}: {message}", fields=[{"field": field, "message": message}]
    )
