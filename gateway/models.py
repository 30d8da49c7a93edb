"""Request and response models of the HTTP API.

The same models validate requests and generate `/openapi.json`, so the document
cannot drift from what the gateway accepts.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backends.egress.rules import Rule

MAX_FILES = 64
MAX_PATH_CHARS = 255
# Names (maybe `*.`), IPv4 addresses or CIDR ranges, IPv6 ones in brackets; then
# backends.egress.rules decides what each is (Rule.parse).
_EGRESS = re.compile(
    r"^((\*\.)?[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?(/[0-9]{1,2})?|\[[0-9A-Fa-f:.]{2,45}(/[0-9]{1,3})?\])"
    r":(\*|[0-9]{1,5})$"
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StrictIn(Strict):
    """What a client sends: no coercion, so every reader sees one value. `true` is not
    an integer, `"5"` is not a number, and `1.0` is not an integer where one is
    declared (an integer is always accepted where a number is)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def check_relative_path(path: str) -> str:
    """A workspace path: relative, normalised, no `..`, no control characters."""
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"must be 1..{MAX_PATH_CHARS} characters")
    if any(ord(c) < 32 or c == "\x7f" for c in path) or "\\" in path:
        raise ValueError("must not contain control characters or backslashes")
    if path.startswith("/"):
        raise ValueError("must be relative to the workspace")
    norm = posixpath.normpath(path)
    if norm != path.rstrip("/") or norm in (".", "..") or norm.startswith("../"):
        raise ValueError("must be a normalised path inside the workspace (no '.', '..')")
    return norm


class FileIn(StrictIn):
    path: str = Field(description="Relative path inside the workspace")
    content_b64: str = Field(description="File content, base64")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return check_relative_path(value)

    @field_validator("content_b64")
    @classmethod
    def _b64(cls, value: str) -> str:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("must be valid base64") from None
        return value

    def content(self) -> bytes:
        return base64.b64decode(self.content_b64, validate=True)


class LimitsIn(StrictIn):
    timeout_s: float | None = Field(None, gt=0, le=86400)
    memory_mb: int | None = Field(None, gt=0)
    cpus: float | None = Field(None, gt=0, le=1024)
    pids: int | None = Field(None, gt=0)
    disk_mb: int | None = Field(None, gt=0)
    output_bytes: int | None = Field(None, gt=0)


class NetworkIn(StrictIn):
    egress: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("egress")
    @classmethod
    def _egress(cls, value: list[str]) -> list[str]:
        for item in value:
            if not _EGRESS.match(item):
                raise ValueError(f"{item!r} is not host:port (host may start with '*.')")
            port = item.rsplit(":", 1)[1]
            if port != "*" and not 0 < int(port) < 65536:
                raise ValueError(f"{item!r}: port out of range")
            try:  # what the egress proxy will take it as (`127.1` is neither name nor IP)
                Rule.parse(item)
            except ValueError as exc:
                raise ValueError(str(exc)) from None
        return value


def _utf8(value: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); they cannot be written as UTF-8.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid UTF-8 text") from None
    return value


class ExecutionRequest(StrictIn):
    """Body of `POST /v1/executions`. Only `language` and `code` are required."""

    language: Annotated[str, Field(min_length=1, max_length=32)]
    code: str
    stdin: str = ""
    files: list[FileIn] = Field(default_factory=list, max_length=MAX_FILES)
    limits: LimitsIn = Field(default_factory=LimitsIn)
    network: NetworkIn = Field(default_factory=NetworkIn)
    backend: str | None = None
    approval_token: str | None = None

    @field_validator("code", "stdin")
    @classmethod
    def _text(cls, value: str) -> str:
        return _utf8(value)

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, value: list[FileIn]) -> list[FileIn]:
        seen: set[str] = set()
        for f in value:
            if f.path in seen:
                raise ValueError(f"duplicate path {f.path!r}")
            seen.add(f.path)
        return value


class Truncated(Strict):
    stdout: bool
    stderr: bool


class UsageOut(Strict):
    cpu_ms: int
    max_rss_kb: int


class LimitsOut(Strict):
    timeout_s: float
    memory_mb: int
    cpus: float
    pids: int
    disk_mb: int
    output_bytes: int


class FileOut(Strict):
    path: str
    size: int
    content_b64: str


class NetworkAttempt(Strict):
    kind: Literal["dns", "connect", "http", "tcp", "udp"]
    host: str
    port: int
    verdict: Literal["allowed", "blocked"]
    rule: str = ""  # the egress entry that allowed it, or why it was blocked
    detail: str = ""


class SandboxEventOut(Strict):
    kind: str
    detail: str = ""


class ExecutionResponse(Strict):
    execution_id: str
    status: Literal["ok", "error", "timeout", "oom", "killed", "output_limit"]
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: Truncated
    duration_ms: int
    usage: UsageOut
    limits: LimitsOut
    files: list[FileOut]
    network: list[NetworkAttempt]
    events: list[SandboxEventOut]
    backend: str
    decision_id: str
    monitor: list[str] = Field(default_factory=list)


class ExecutionRecord(Strict):
    """`GET /v1/executions/{id}`: the record, with the result once done."""

    execution_id: str
    tenant: str
    status: Literal["pending_approval", "running", "done", "failed"]
    created_at: str
    finished_at: str | None = None
    result: ExecutionResponse | None = None
    error: dict[str, Any] | None = None
    approval: dict[str, Any] | None = None


class ErrorBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str
    message: str


class ErrorResponse(Strict):
    error: ErrorBody


def format_validation_errors(errors: list[Any]) -> list[dict[str, str]]:
    """pydantic errors -> [{"field": "limits.timeout_s", "message": ...}]."""
    out = []
    for err in errors:
        loc = ".".join(str(p) for p in err.get("loc", ()))
        out.append({"field": loc or "body", "message": err.get("msg", "invalid")})
    return out


class DecisionRequest(StrictIn):
    """Body of `POST /v1/approvals/{id}/decision`."""

    decision: Literal["approve", "deny"]
    reason: str = Field("", max_length=2000)
    # Who decided, for signed callbacks (a JWT names its own subject).
    approver: str | None = Field(None, max_length=200)
    # The approval decided: required in a signed callback (the signature then covers
    # it, so a callback for one approval cannot decide another); optional with a JWT,
    # and then it must name the approval of the URL.
    approval_id: str | None = Field(None, max_length=100)


class HeldResponse(Strict):
    """202: the execution waits for a person."""

    status: Literal["pending_approval"]
    approval_id: str
    execution_id: str
    expires_at: str
    reasons: list[str]
