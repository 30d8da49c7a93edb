"""What an approval approves: one canonical digest of everything that determines what runs.

An approval token carries `binding = {"v", "sha256", "parts"}`: for each part below
the sha256 of its canonical JSON, and the sha256 of the canonical JSON of
`{"v": ..., "parts": {...}}`. At redemption the presented request's binding is
computed the same way and compared whole; a difference names the parts that differ
(never their values), so the refusal says what changed without echoing a secret.

Version `execgate.approval-binding/v1`, the parts and their JSON values:

| part      | value                                                                  |
|-----------|------------------------------------------------------------------------|
| language  | the request's `language`                                               |
| code      | sha256 hex of the UTF-8 code (for a guarded tool: its canonical arguments) |
| files     | `[{"path", "sha256"}]` of every input file, sorted by path             |
| stdin     | sha256 hex of the UTF-8 stdin                                          |
| backend   | the backend the request resolved to (null for a tool call)             |
| tool      | `{"name", "server"}` of a guarded upstream tool call, else null        |
| limits    | the requested limits, `{name: number}` without unset ones              |
| egress    | the requested egress entries, sorted, without duplicates               |
| requester | the requester's `sub`                                                  |
| tenant    | the requester's tenant                                                 |

Canonical JSON: keys sorted, `(",", ":")` separators, UTF-8, integral numbers
written as integers (so `256` and `256.0` bind alike). A new part or a change of a
value's shape is a new version; a token of another version is refused.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.context import ExecContext

VERSION = "execgate.approval-binding/v1"
PARTS = (
    "language",
    "code",
    "files",
    "stdin",
    "backend",
    "tool",
    "limits",
    "egress",
    "requester",
    "tenant",
)


def _number(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tool_of(ctx: ExecContext) -> dict[str, Any] | None:
    """The guarded upstream tool a call goes to ({"name", "server"}), or None for code."""
    if ctx.tool_call is None:
        return None
    return {"name": ctx.tool_call.get("name"), "server": ctx.tool_call.get("server")}


def values_of(ctx: ExecContext) -> dict[str, Any]:
    """The bound values of a validated request (its principal authenticated)."""
    request, principal = ctx.request, ctx.principal
    assert request is not None and principal is not None
    files = sorted(
        ({"path": f.path, "sha256": _sha256(f.content())} for f in request.files),
        key=lambda f: f["path"],
    )
    limits = {k: _number(v) for k, v in request.limits.model_dump(exclude_none=True).items()}
    return {
        "language": request.language,
        "code": _sha256(request.code.encode("utf-8")),
        "files": files,
        "stdin": _sha256(request.stdin.encode("utf-8")),
        "backend": ctx.backend,
        "tool": tool_of(ctx),
        "limits": limits,
        "egress": sorted(set(request.network.egress)),
        "requester": principal.sub,
        "tenant": principal.tenant,
    }


def seal(values: dict[str, Any]) -> dict[str, Any]:
    """The token's `binding` claim for these values."""
    parts = {name: _sha256(canonical(values[name])) for name in PARTS}
    digest = _sha256(canonical({"v": VERSION, "parts": parts}))
    return {"v": VERSION, "sha256": digest, "parts": parts}


def of(ctx: ExecContext) -> dict[str, Any]:
    return seal(values_of(ctx))


def differences(approved: Any, presented: dict[str, Any]) -> list[str]:
    """The parts in which a presented request differs from the approved binding;
    every part when the approved one is missing, of another version or malformed."""
    if (
        not isinstance(approved, dict)
        or approved.get("v") != VERSION
        or not isinstance(approved.get("parts"), dict)
    ):
        return list(PARTS)
    if approved.get("sha256") == presented["sha256"]:
        return []
    theirs = approved["parts"]
    mismatch = [name for name in PARTS if theirs.get(name) != presented["parts"][name]]
    # Same parts but another digest: the claim is not one this gateway sealed.
    return mismatch or list(PARTS)
