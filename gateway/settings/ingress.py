"""Settings of the drop-in ingresses: the MCP endpoint and the reverse-proxy routes.

Kept apart from gateway/settings/model.py (which embeds them under `[ingress]`) because
they are one concept: where the gateway forwards to, with whose credentials, and
which requests it keeps for itself.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.proxy.headers import NEVER_FORWARDED

# Paths the gateway serves itself; a route may not shadow them.
GATEWAY_PATHS = ("/v1", "/mcp", "/healthz", "/readyz", "/metrics", "/openapi.json", "/console")
_POINTER = re.compile(r"^(/([^~/]|~[01])*)*$")
_HEADER = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
ANSWER_FIELDS = frozenset(
    {"stdout", "stderr", "exit_code", "status", "execution_id", "error", "approval_id"}
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


def _pointer(value: str) -> str:
    if value and not _POINTER.match(value):
        raise ValueError(f"{value!r} is not a JSON pointer (RFC 6901)")
    return value


def _header(value: str) -> str:
    if value and not _HEADER.match(value):
        raise ValueError(f"{value!r} is not an HTTP header name")
    return value


class McpSettings(_Strict):
    """`[ingress.mcp]`: the MCP endpoint at /mcp and its optional upstream MCP server."""

    enabled: bool = True
    # Browser origins allowed to call /mcp (exact "scheme://host[:port]"); a request
    # without Origin (a non-browser client) is allowed, any other Origin gets 403.
    allowed_origins: list[str] = []
    # Streamable HTTP endpoint of an MCP server whose tools /mcp also offers ("": none).
    upstream_url: str = ""
    # The gateway's own credential for the upstream, read from a file at start; the
    # caller's token is never forwarded.
    upstream_auth_header: str = "Authorization"
    upstream_auth_value_file: str = ""
    # Upstream tools that go through policy (and approval) before being forwarded.
    guarded_tools: list[str] = []
    upstream_timeout_s: float = Field(30.0, gt=0)
    # How long the upstream's tool list is reused before asking again.
    upstream_tools_cache_s: float = Field(30.0, ge=0)
    max_sessions: int = Field(10_000, ge=1)
    session_idle_s: float = Field(3600.0, gt=0)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        return [origin.rstrip("/") for origin in value]

    @field_validator("upstream_auth_header")
    @classmethod
    def _auth_header(cls, value: str) -> str:
        return _header(value)

    @field_validator("upstream_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value


class InterceptSettings(_Strict):
    """Requests of a route the gateway runs itself, and how it answers them."""

    method: str = "POST"
    # fnmatch pattern on the request path (the full path, prefix included).
    path: str
    # JSON pointers into the request body; a fixed `language` wins over the pointer.
    language: str | None = None
    language_pointer: str = "/language"
    code_pointer: str = "/code"
    files_pointer: str = ""
    stdin_pointer: str = ""
    # The answer: `answer_template` (any JSON) with result fields set at pointers,
    # e.g. {"stdout": "/run/stdout", "exit_code": "/run/code"}.
    answer_template: Any = Field(default_factory=dict)
    answer_pointers: dict[str, str] = Field(
        default_factory=lambda: {
            "stdout": "/stdout",
            "stderr": "/stderr",
            "exit_code": "/exit_code",
            "status": "/status",
            "execution_id": "/execution_id",
            "error": "/error",
            "approval_id": "/approval_id",
        }
    )

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        return value.upper()

    @field_validator("language_pointer", "code_pointer", "files_pointer", "stdin_pointer")
    @classmethod
    def _pointers(cls, value: str) -> str:
        return _pointer(value)

    @field_validator("answer_pointers")
    @classmethod
    def _answer(cls, value: dict[str, str]) -> dict[str, str]:
        for key, pointer in value.items():
            if key not in ANSWER_FIELDS:
                raise ValueError(f"{key!r}: not an answer field ({sorted(ANSWER_FIELDS)})")
            if not pointer:
                raise ValueError(f"{key}: empty pointer (the answer is the template's root)")
            _pointer(pointer)
        return value


class RouteSettings(_Strict):
    """One `[[ingress.routes]]`: a path prefix reverse-proxied to an upstream."""

    prefix: str
    # The rest of the path after `prefix` is appended to this URL.
    upstream_url: str
    # "jwt": pass-through needs an execgate bearer token too (verified, never
    # forwarded); "none": an open pass-through. Intercepted requests always need one.
    auth: Literal["jwt", "none"] = "jwt"
    # The token scope a pass-through needs (auth = "jwt"); "" means
    # "proxy:<prefix without its leading />", e.g. "proxy:openai". Admitted requests
    # also spend the tenant's request rate.
    scope: str = ""
    # Request headers forwarded besides the built-in allowlist (gateway/proxy/headers.py),
    # e.g. ["OpenAI-Organization", "anthropic-version"]. Credentials, framing,
    # Forwarded/X-Forwarded-*/X-Real-IP and URL or method overrides cannot be named.
    forward_headers: list[str] = []
    credential_header: str = ""
    credential_value_file: str = ""
    connect_timeout_s: float = Field(5.0, gt=0)
    # Until the upstream's response headers arrive, then between chunks of its body.
    read_timeout_s: float = Field(60.0, gt=0)
    intercept: list[InterceptSettings] = []

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        value = value.rstrip("/")
        if not value.startswith("/") or "{" in value or "}" in value:
            raise ValueError("must start with '/' and hold no '{' or '}'")
        for own in GATEWAY_PATHS:
            if value == own or value.startswith(own + "/") or own.startswith(value + "/"):
                raise ValueError(f"overlaps the gateway's own {own}")
        return value

    @field_validator("upstream_url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL")
        return value

    @field_validator("credential_header")
    @classmethod
    def _credential_header(cls, value: str) -> str:
        return _header(value)

    @field_validator("scope")
    @classmethod
    def _scope(cls, value: str) -> str:
        if value and not re.fullmatch(r"[!-~]+", value):
            raise ValueError("a scope is one token of visible ASCII (no spaces)")
        return value

    @field_validator("forward_headers")
    @classmethod
    def _forward_headers(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or not _HEADER.match(name):
                raise ValueError(f"{name!r} is not an HTTP header name")
            if name.lower() in NEVER_FORWARDED:
                raise ValueError(f"{name} is never forwarded (credential, framing or override)")
        return value

    @model_validator(mode="after")
    def _credential_not_forwarded(self) -> RouteSettings:
        if self.credential_header.lower() in {h.lower() for h in self.forward_headers}:
            raise ValueError(
                f"forward_headers: {self.credential_header} carries the route's credential"
            )
        return self

    @property
    def required_scope(self) -> str:
        return self.scope or "proxy:" + self.prefix.lstrip("/")
