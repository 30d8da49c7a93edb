"""Differential check: the embedded engines and a real OPA server decide alike.

Hypothesis generates varied policy inputs around the shipped policy's rules, in
three kinds drawn alike: well-formed requests a tenant's data allows (limits,
tiers, egress on the allowlist, approvals presented), the same with what needs a
human (native code, a feature or language the tenant holds for approval), and
odd ones (missing sections, odd scopes and claims, limits as strings, negatives,
fractions and huge numbers, malformed egress, unknown features, half-present
approvals). Each goes through every engine's API (the default embedded engine,
OPA Wasm; rego-cpp; OPA), and any difference from OPA's answer fails with the
input printed. Allows, holds and denials are each a real share of what was
compared (printed, and held above a floor that follows from the kinds' equal
odds), so obligations and approval sections are compared too, not only denials.
The engines are started once, on one event loop owned by this module
(hypothesis drives a synchronous test).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.policy.base import PolicyEngine, PolicyEngineError
from gateway.policy.embedded import EmbeddedEngine
from gateway.policy.opa import OpaEngine
from gateway.policy.wasm import WasmEngine
from gateway.review.document import parse_flags
from tests.policies.inputs import base_input
from tests.policies.opa_server import POLICIES, OpaServer, find_opa

# At least 500 (the floor); EXECGATE_DIFF_EXAMPLES=5000 for a longer hunt.
EXAMPLES = int(os.environ.get("EXECGATE_DIFF_EXAMPLES", "600"))

LIMIT_KEYS = ["timeout_s", "memory_mb", "cpus", "pids", "disk_mb", "output_bytes"]
# Drawn alike: well-formed and allowed, well-formed and held, odd (mostly denied).
KINDS = ["allow", "hold", "odd"]
# Each decision's share of the examples stays above this: a third of the draws
# aims at it (odd inputs are nearly all denials), less what hypothesis's own
# choice of examples and the odd allow or hold take away.
FLOOR = 0.15
texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
numbers = st.one_of(
    st.integers(-5, 5000),
    st.sampled_from(
        # 32-bit edges: OPA's Wasm format_int aborts beyond them, rego-cpp's %d wraps.
        [
            *(0, -1, 1, 0.5, 1.5, 2**31, 2**31 - 1, -(2**31), 2**32, 2**53),
            *(10**20, -(10**20), 1e-7, 123.456),
        ]
    ),
    st.floats(-1e9, 1e9, allow_nan=False).map(lambda x: round(x, 3)),
)
odd_values = st.one_of(numbers, texts, st.booleans(), st.none(), st.just([]), st.just({}))
limits = st.dictionaries(
    st.one_of(st.sampled_from([*LIMIT_KEYS, "gpus"]), texts), odd_values, max_size=5
)
ceilings = st.dictionaries(st.sampled_from(LIMIT_KEYS), odd_values, max_size=6)
languages = st.one_of(st.sampled_from(["python", "bash", "javascript", "ruby", ""]), texts)
tenants = st.one_of(st.sampled_from(["acme", "initech", "umbrella", "bench", "default"]), texts)
scopes = st.lists(
    st.one_of(
        st.sampled_from(
            ["exec:python", "exec:bash", "exec:javascript", "net:egress", "exec:*", "EXEC:PYTHON"]
        ),
        texts,
    ),
    max_size=5,
)
destinations = st.one_of(
    st.sampled_from(
        [
            "api.example.com:443",
            "API.Example.COM:443",
            "x.example.org:443",
            "example.org:443",
            "10.0.0.1:8080",
            "[2001:db8::1]:53",
            "h:0",
            "h:65535",
            "h:65536",
            "no-port",
            ":80",
            "a b:1",
        ]
    ),
    texts,
    st.integers(-1, 70000),
)
features = st.lists(
    st.sampled_from(
        ["subprocess", "network", "dynamic_code", "filesystem_write", "native_code", "x"]
    ),
    max_size=4,
)
imports = st.lists(
    st.one_of(st.sampled_from(["os", "socket", "ctypes", "cffi", "subprocess", "_ctypes"]), texts),
    max_size=4,
)
claims = st.dictionaries(
    st.sampled_from(["tier", "trust", "sub", "api_token"]),
    st.one_of(st.sampled_from(["free", "pro", "platinum", "untrusted"]), odd_values),
    max_size=4,
)
approvals = st.fixed_dictionaries(
    {},
    optional={
        "present": st.one_of(st.booleans(), texts),
        "code_sha256_match": st.one_of(st.booleans(), texts),
        "request_match": st.one_of(st.booleans(), texts),
        "id": texts,
    },
)


# The shipped tenant data (policies/tenants/data.json), as far as the well-formed
# kinds need it: each tenant's languages, egress allowlist, what it holds for
# approval and what it blocks.
TENANTS: dict[str, dict[str, Any]] = {
    "acme": {"languages": ["python", "bash", "javascript"], "hold": ["native_code"],
             "egress": ["api.example.com:443", "x.example.org:443", "10.0.0.1:8080",
                        "[2001:db8::1]:53", "API.Example.COM:443"]},
    "initech": {"languages": ["python"], "hold": ["native_code", "subprocess"],
                "hold_languages": ["bash"], "egress": []},
    "umbrella": {"languages": ["python", "bash", "javascript"], "hold": ["native_code"],
                 "egress": []},
    "default": {"languages": ["python", "bash", "javascript"], "hold": ["native_code"],
                "egress": []},
}  # fmt: skip
positive = st.one_of(
    st.integers(1, 5000), st.floats(0.1, 4096, allow_nan=False).map(lambda x: round(x, 2))
)
sane_limits = st.dictionaries(st.sampled_from(LIMIT_KEYS), positive, max_size=6)


@st.composite
def well_formed(draw: st.DrawFn, hold: bool) -> dict[str, Any]:
    """A request the tenant's data allows; with `hold`, one it holds for a human."""
    doc = base_input()
    tenant = draw(st.sampled_from(sorted(TENANTS)))
    data = TENANTS[tenant]
    held_languages = data.get("hold_languages", [])
    if hold and held_languages and draw(st.booleans()):
        language = draw(st.sampled_from(held_languages))
        held_features: list[str] = []
    else:
        language = draw(st.sampled_from(data["languages"]))
        held_features = [draw(st.sampled_from(data["hold"]))] if hold else []
    doc["tenant"]["id"] = tenant
    doc["tenant"]["languages"] = sorted({language, *draw(st.lists(languages, max_size=2))})
    doc["tenant"]["ceilings"] = draw(st.dictionaries(st.sampled_from(LIMIT_KEYS), positive))
    egress = draw(st.lists(st.sampled_from(data["egress"]), max_size=3)) if data["egress"] else []
    doc["subject"]["scopes"] = [f"exec:{language}", *(["net:egress"] if egress else []),
                                *draw(st.lists(st.sampled_from(["exec:bash", "admin:x"]),
                                               max_size=2))]  # fmt: skip
    doc["subject"]["claims"] = draw(
        st.fixed_dictionaries({}, optional={"tier": st.sampled_from(["free", "pro", "gold"])})
    )
    doc["execution"]["language"] = language
    doc["execution"]["limits"] = draw(sane_limits)
    doc["execution"]["egress"] = egress
    native = "native_code" in held_features
    doc["analysis"] = {
        "parsed": True,
        "imports": ["cffi"] if native else draw(st.lists(st.sampled_from(["json", "math"]))),
        "calls": ["print"],
        "features": sorted({*held_features, *draw(st.lists(st.sampled_from(["dynamic_code"])))}),
    }
    # Approved code runs without a hold; a held request may carry a token that
    # does not cover this code.
    present = draw(st.booleans())
    doc["approval"] = {"present": present, "code_sha256_match": present and not hold}
    return doc


@st.composite
def policy_inputs(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(KINDS))
    if kind != "odd":
        return draw(well_formed(hold=kind == "hold"))
    doc = base_input()
    doc["tenant"]["id"] = draw(tenants)
    doc["tenant"]["languages"] = draw(st.lists(languages, max_size=4))
    doc["tenant"]["ceilings"] = draw(ceilings)
    doc["subject"]["scopes"] = draw(scopes)
    doc["subject"]["claims"] = draw(claims)
    doc["execution"]["language"] = draw(languages)
    doc["execution"]["limits"] = draw(st.one_of(limits, limits, odd_values))
    doc["execution"]["egress"] = draw(st.lists(destinations, max_size=4))
    doc["analysis"] = {
        "parsed": draw(st.one_of(st.booleans(), odd_values)),
        "imports": draw(imports),
        "calls": draw(st.lists(texts, max_size=3)),
        "features": draw(features),
    }
    doc["approval"] = draw(approvals)
    doc["version"] = draw(st.sampled_from(["execgate.input/v1"] * 5 + ["execgate.input/v2", None]))
    # Sections or fields that are missing altogether.
    for section in draw(st.lists(st.sampled_from(sorted(doc)), max_size=2, unique=True)):
        del doc[section]
    for section, field in draw(
        st.lists(
            st.sampled_from(
                [("execution", "limits"), ("subject", "scopes"), ("tenant", "id"),
                 ("tenant", "languages"), ("execution", "egress"), ("subject", "claims")]
            ),
            max_size=2,
        )
    ):  # fmt: skip
        doc.get(section, {}).pop(field, None)
    return doc


class Engines:
    def __init__(self, server: OpaServer) -> None:
        self.loop = asyncio.new_event_loop()
        self.wasm = WasmEngine(POLICIES, timeout_ms=10_000, opa_bin=find_opa())
        self.rego_cpp = EmbeddedEngine(POLICIES, timeout_ms=10_000)
        self.opa = OpaEngine(server.url, timeout_ms=10_000)
        for engine in (self.wasm, self.rego_cpp, self.opa):
            self.loop.run_until_complete(engine.start())

    def decide(self, doc: dict[str, Any]) -> list[Any]:
        async def each() -> list[Any]:
            engines = (self.wasm, self.rego_cpp, self.opa)
            return list(await asyncio.gather(*(_value(engine, doc) for engine in engines)))

        return self.loop.run_until_complete(each())

    def close(self) -> None:
        for engine in (self.wasm, self.rego_cpp, self.opa):
            self.loop.run_until_complete(engine.close())
        self.loop.close()


async def _value(engine: PolicyEngine, doc: dict[str, Any]) -> Any:
    """The decision with `deny` and `monitor` in the order the gateway puts them.

    rego-cpp orders strings by their JSON-escaped text, so lists of reasons that
    hold quotes or control characters may come in another order; the gateway
    sorts both (gateway/policy/decision.py), and only their content is the decision.
    """
    try:
        value = (await engine.decide(doc)).value
    except PolicyEngineError as exc:
        return f"error ({exc.kind})"
    for key in ("deny", "monitor"):
        if isinstance(value.get(key), list):
            value[key] = sorted(value[key], key=str)
    return value


@pytest.fixture(scope="module")
def engines(opa_server: OpaServer) -> Iterator[Engines]:
    built = Engines(opa_server)
    yield built
    built.close()


def outcome(value: Any) -> str:
    if not isinstance(value, dict):
        return "error"
    if value.get("allow") is True:
        return "allow"
    return "hold" if value.get("require_approval") is True else "deny"


def test_engines_agree(engines: Engines, capsys: pytest.CaptureFixture[str]) -> None:
    mix: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(doc=policy_inputs())
    def agree(doc: dict[str, Any]) -> None:
        wasm, rego_cpp, opa = engines.decide(doc)
        shown = json.dumps(doc, ensure_ascii=False)
        assert wasm == opa, "embedded (OPA Wasm) and OPA disagree on input:\n" + shown
        assert rego_cpp == opa, "rego-cpp and OPA disagree on input:\n" + shown
        mix[outcome(opa)] += 1

    agree()
    total = sum(mix.values())
    with capsys.disabled():
        print(f"\npolicy differential: {total} inputs, " + ", ".join(
            f"{k} {mix[k]} ({mix[k] / total:.0%})" for k in ("allow", "hold", "deny", "error")
        ))  # fmt: skip
    for kind in ("allow", "hold", "deny"):
        assert mix[kind] >= FLOOR * total, mix


# --- the second question: data.execgate.review over a behaviour record -------------

_paths = st.one_of(
    st.sampled_from([
        "/etc/shadow", "/root/.ssh/id_rsa", "/proc/1/environ", "/proc/self/environ",
        "/home/a/.aws/credentials", "/workspace/out.txt", "missing.csv", "/etc/hosts",
        "/var/run/secrets/kubernetes.io/serviceaccount/token", "/dev/mem",
    ]),
    texts,
)  # fmt: skip
_results = st.sampled_from(["ok", "ENOENT", "EACCES", "EPERM", "EROFS"])
_files = st.fixed_dictionaries({
    "op": st.sampled_from(["open", "read", "create", "write", "rename", "unlink", "mkdir"]),
    "path": _paths, "result": _results, "count": st.integers(1, 5),
})  # fmt: skip
_programs = st.fixed_dictionaries({
    "path": st.sampled_from(["/bin/sh", "/usr/bin/bash", "/usr/bin/id", "/nope"]) | texts,
    "argv": st.lists(texts, max_size=3), "result": _results, "count": st.integers(1, 3),
})  # fmt: skip
_signals = st.fixed_dictionaries({
    "syscall": st.sampled_from(["kill", "tgkill", "ptrace", "process_vm_readv"]),
    "target": st.integers(0, 40), "signal": st.integers(0, 31), "result": _results,
    "count": st.integers(1, 3),
})  # fmt: skip
_network = st.fixed_dictionaries({
    "kind": st.sampled_from(["connect", "dns"]), "host": texts, "port": st.integers(0, 65535),
    "verdict": st.sampled_from(["allowed", "blocked"]), "rule": texts, "detail": texts,
})  # fmt: skip


@st.composite
def review_inputs(draw: st.DrawFn) -> dict[str, Any]:
    syscalls = st.sampled_from(["mount", "ptrace", "getrandom", "bpf", "unshare", "open"])
    return {
        "version": "execgate.review/v1",
        "execution": {"id": "exe_x", "language": draw(st.sampled_from(["python", "bash"])),
                      "backend": "nsjail", "status": "ok", "exit_code": 0},
        "subject": {"sub": "agent", "tenant": "acme"},
        "behaviour": {
            "capture": "on",
            "files": draw(st.lists(_files, max_size=4)),
            "programs": draw(st.lists(_programs, max_size=2)),
            "signals": draw(st.lists(_signals, max_size=2)),
            "syscalls_refused": draw(st.dictionaries(syscalls, st.integers(1, 9), max_size=3)),
            "dropped": draw(st.integers(0, 3)),
        },
        "network": draw(st.lists(_network, max_size=2)),
    }  # fmt: skip


def test_engines_agree_on_review(engines: Engines) -> None:
    async def each(doc: dict[str, Any]) -> list[Any]:
        async def one(engine: PolicyEngine) -> Any:
            try:
                answer = await engine.review(doc)
            except PolicyEngineError as exc:
                return f"error ({exc.kind})"
            # In the gateway's order (rego-cpp sorts strings by their escaped text).
            flags, problem = parse_flags(answer)
            return {"flags": [f.as_dict() for f in flags], "problem": problem}

        return list(
            await asyncio.gather(*(one(e) for e in (engines.wasm, engines.rego_cpp, engines.opa)))
        )

    flagged = 0

    @settings(max_examples=max(200, EXAMPLES // 3), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(doc=review_inputs())
    def agree(doc: dict[str, Any]) -> None:
        nonlocal flagged
        wasm, rego_cpp, opa = engines.loop.run_until_complete(each(doc))
        shown = json.dumps(doc, ensure_ascii=False)
        assert isinstance(opa, dict), f"OPA gave no review ({opa}) for:\n{shown}"
        assert wasm == opa, "embedded (OPA Wasm) and OPA review differently:\n" + shown
        assert rego_cpp == opa, "rego-cpp and OPA review differently:\n" + shown
        assert opa["problem"] == ""
        flagged += bool(opa["flags"])

    agree()
    assert flagged > 0  # the inputs reached the rules
