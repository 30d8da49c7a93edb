"""`/openapi.json`, generated from the pydantic models that validate requests."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway import errors
from gateway.models import (
    DecisionRequest,
    ErrorResponse,
    ExecutionRecord,
    ExecutionRequest,
    ExecutionResponse,
    HeldResponse,
)

_REF = "#/components/schemas/{model}"


def _schemas(*models: type[BaseModel]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=_REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    return out


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(model=name)}


def _error(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": _ref("ErrorResponse")}},
    }


def _json(name: str, description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def build_openapi(version: str) -> dict[str, Any]:
    codes = ", ".join(k.code for k in errors.ALL_KINDS)
    bearer = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "execgate",
            "version": version,
            "description": "Policy-enforcing gateway for AI-generated code execution. "
            f"Error codes: {codes}.",
        },
        "components": {
            "schemas": _schemas(
                ExecutionRequest,
                ExecutionResponse,
                ExecutionRecord,
                ErrorResponse,
                DecisionRequest,
                HeldResponse,
            ),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
        },
        "paths": {
            "/v1/executions": {
                "post": {
                    "summary": "Run code in a fresh sandbox",
                    "security": bearer,
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("ExecutionRequest")}},
                    },
                    "responses": {
                        "200": _json(
                            "ExecutionResponse", "The code ran (whatever its exit status)"
                        ),
                        "202": _json("HeldResponse", "Held for human approval"),
                        "400": _error("invalid_request: error.fields lists each bad field"),
                        "401": _error("unauthenticated"),
                        "403": _error("forbidden (scope) or policy_denied (error.reasons)"),
                        "413": _error("too_large"),
                        "429": _error("rate_limited or quota_exceeded, with Retry-After"),
                        "503": _error("policy_unavailable, policy_invalid, backend_unavailable"),
                    },
                }
            },
            "/v1/executions/{execution_id}": {
                "get": {
                    "summary": "An execution record; ?wait=S long-polls until done",
                    "security": bearer,
                    "parameters": [
                        {
                            "name": "execution_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        },
                        {
                            "name": "wait",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "number", "minimum": 0},
                        },
                    ],
                    "responses": {
                        "200": _json("ExecutionRecord", "The record"),
                        "401": _error("unauthenticated"),
                        "404": _error("not_found (or another tenant's)"),
                    },
                }
            },
            "/v1/approvals": {
                "get": {
                    "summary": "Approvals (approvals:read: own tenant; approvals:read:all: any)",
                    "security": bearer,
                    "parameters": [
                        {"name": n, "in": "query", "required": False, "schema": {"type": t}}
                        for n, t in (
                            ("status", "string"),
                            ("tenant", "string"),
                            ("limit", "integer"),
                        )
                    ],
                    "responses": {
                        "200": {"description": "{approvals: [...]}"},
                        "401": _error("unauthenticated"),
                        "403": _error("forbidden"),
                    },
                }
            },
            "/v1/approvals/{approval_id}": {
                "get": {
                    "summary": "One approval (its requester, or approvals:read)",
                    "security": bearer,
                    "parameters": [
                        {
                            "name": "approval_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {"description": "the approval"},
                        "404": _error("not_found"),
                    },
                }
            },
            "/v1/approvals/{approval_id}/decision": {
                "post": {
                    "summary": "Approve or deny (approvals:decide JWT, or a signed callback)",
                    "security": bearer,
                    "parameters": [
                        {
                            "name": "approval_id",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("DecisionRequest")}},
                    },
                    "responses": {
                        "200": {
                            "description": (
                                "JWT: the approval; approve adds approval_token. Signed "
                                "callback: {approval_id, status, approver, decided_at, "
                                "webhook_id, duplicate}, never a token"
                            )
                        },
                        "400": _error("invalid_request (a callback without approval_id)"),
                        "401": _error("unauthenticated (JWT or callback signature)"),
                        "403": _error("forbidden (scope, self-approval, other_approval)"),
                        "404": _error("not_found"),
                        "409": _error("conflict (webhook_id_reused) or approval_expired"),
                    },
                }
            },
            "/v1/audit": {
                "get": {
                    "summary": "Audit records (scope audit:read: own tenant; audit:read:all: any)",
                    "security": bearer,
                    "parameters": [
                        {"name": n, "in": "query", "required": False, "schema": {"type": t}}
                        for n, t in (
                            ("tenant", "string"),
                            ("type", "string"),
                            ("since", "string"),
                            ("execution_id", "string"),
                            ("after_seq", "integer"),
                            ("order", "string"),
                            ("before", "integer"),
                            ("limit", "integer"),
                            ("flagged", "boolean"),
                            ("severity", "string"),
                            ("attempt", "string"),
                        )
                    ],
                    "responses": {
                        "200": {"description": "{records, next_after_seq} (desc: next_before)"},
                        "400": _error("invalid_request"),
                        "401": _error("unauthenticated"),
                        "403": _error("forbidden"),
                    },
                }
            },
            "/v1/tool-calls": {
                "post": {
                    "summary": "OpenAI Chat tool_calls, Responses function_call items or "
                    "Anthropic tool_use blocks in; the matching tool replies out, same ids",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "{messages} | {items} | {role, content}"},
                        "400": _error("invalid_request"),
                        "401": _error("unauthenticated"),
                    },
                }
            },
            "/mcp": {
                m: {
                    "summary": f"MCP Streamable HTTP ({m.upper()}): 2025-11-25 sessions "
                    "(MCP-Session-Id) and 2026-07-28 (Mcp-Method/Mcp-Name headers)",
                    "security": bearer,
                    "responses": {
                        "200": {"description": "JSON-RPC answer"},
                        "202": {"description": "notification accepted"},
                        "204": {"description": "session ended"},
                        "400": {"description": "JSON-RPC error (-32700, -32600, -32020, ...)"},
                        "401": _error("unauthenticated"),
                        "403": _error("forbidden (Origin not allowed)"),
                        "404": {"description": "unknown or expired session"},
                        "405": {"description": "GET: no server-initiated stream"},
                    },
                }
                for m in ("post", "get", "delete")
            },
            "/healthz": {
                "get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: policy engine, backends and audit log usable",
                    "responses": {
                        "200": {"description": "ready"},
                        "503": {"description": "not ready"},
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "text"}},
                }
            },
            "/openapi.json": {
                "get": {"summary": "This document", "responses": {"200": {"description": "json"}}}
            },
        },
    }
