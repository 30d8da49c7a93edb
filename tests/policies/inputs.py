"""Policy inputs (SPEC section 4) for tests: a typical one and ways to vary it."""

from __future__ import annotations

import copy
from typing import Any

_BASE: dict[str, Any] = {
    "version": "execgate.input/v1",
    "request": {
        "id": "req_test",
        "time": "2026-11-29T10:00:00Z",
        "ingress": "rest",
        "tool_name": "run_code",
        "source_ip": "127.0.0.1",
    },
    "subject": {
        "sub": "svc:agent-7",
        "tenant": "acme",
        "scopes": ["exec:python", "exec:bash"],
        "claims": {},
    },
    "tenant": {
        "id": "acme",
        "ceilings": {
            "timeout_s": 30,
            "memory_mb": 512,
            "cpus": 1.5,
            "pids": 64,
            "disk_mb": 64,
            "output_bytes": 1048576,
        },
        "usage": {"concurrent": 1, "cpu_s_last_hour": 12.5},
        "languages": ["python", "bash"],
    },
    "execution": {
        "language": "python",
        "code": "print(sum(range(10)))",
        "code_sha256": "0f1e",
        "code_bytes": 21,
        "files": [],
        "limits": {"timeout_s": 5, "memory_mb": 256},
        "egress": [],
        "backend": "nsjail",
    },
    "analysis": {"parsed": True, "imports": [], "calls": ["print", "range", "sum"], "features": []},
    "approval": {"present": False},
}


def base_input() -> dict[str, Any]:
    return copy.deepcopy(_BASE)


def patched(**sections: Any) -> dict[str, Any]:
    """base_input() with each keyword's dict merged one level into that section."""
    doc = base_input()
    for section, patch in sections.items():
        if isinstance(patch, dict) and isinstance(doc.get(section), dict):
            doc[section].update(copy.deepcopy(patch))
        else:
            doc[section] = copy.deepcopy(patch)
    return doc


def corpus() -> list[dict[str, Any]]:
    """Inputs that exercise every rule, including odd and hostile values."""
    net = ["exec:python", "exec:bash", "net:egress"]
    return [
        base_input(),
        patched(subject={"scopes": []}),
        patched(execution={"language": "bash"}, subject={"scopes": ["exec:python"]}),
        patched(tenant={"languages": ["bash"]}),
        patched(execution={"language": "ruby"}),
        patched(
            execution={"language": "tool"}, tool={"name": "echo"}, subject={"scopes": ["tool:*"]}
        ),
        patched(execution={"language": "tool"}, tool={"name": 7}, tenant={"id": "globex"}),
        patched(execution={"language": "tool"}, tool="junk", subject={"scopes": ["tool:"]}),
        patched(execution={"limits": {"timeout_s": 300, "memory_mb": 4096, "cpus": 8}}),
        patched(execution={"limits": {"pids": 9}}, tenant={"ceilings": {"pids": 10}}),
        patched(execution={"limits": {"pids": 10}}, tenant={"ceilings": {"pids": 9}}),
        patched(execution={"limits": {"timeout_s": 0, "memory_mb": -1, "gpus": 1}}),
        patched(execution={"limits": {"pids": "64", "cpus": True, "disk_mb": None}}),
        patched(execution={"limits": {}}, tenant={"ceilings": {}}),
        patched(execution={"egress": ["api.example.com:443"]}),
        patched(execution={"egress": ["api.example.com:443", "[::1]:80"]}, subject={"scopes": net}),
        patched(
            execution={"egress": ["bad", "h:0", "h:70000", 5, 'q"uote:1']},
            subject={"scopes": net},
        ),
        patched(analysis={"imports": ["ctypes", "cffi", "os"], "features": ["native_code"]}),
        patched(analysis={"imports": [], "features": ["native_code"]}),
        patched(
            analysis={"imports": ["ctypes"], "features": ["native_code"]},
            approval={
                "present": True,
                "id": "apr_1",
                "approver": "a",
                "code_sha256_match": True,
                "request_match": True,
            },
        ),
        patched(
            analysis={"imports": ["ctypes"], "features": ["native_code"]},
            approval={"present": True, "id": "apr_1", "code_sha256_match": False},
        ),
        patched(analysis={"features": ["dynamic_code"], "parsed": False}),
        patched(version="execgate.input/v2"),
        patched(execution={"language": 'py"th\\on\n\u00e9\u20ac', "code": "a\u0000b"}),
        patched(tenant={"id": 't\u00e9"n'}, analysis={"features": ["native_code"]}),
        {},
        {"version": "execgate.input/v1"},
    ]
