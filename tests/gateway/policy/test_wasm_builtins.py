"""Host builtins of the Wasm engine against OPA's own output, value by value.

The same policy is evaluated by a real `opa eval` and by the Wasm engine (so the
arguments reach the host `sprintf` exactly as the compiled module hands them
over); every case must come out identical, or fail closed as a case the host
does not format (never a different string).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

from gateway.policy.base import PolicyEngineError
from gateway.policy.wasm import WasmEngine
from gateway.policy.wasm_builtins import RegoNumber, RegoSet, parse_value, sprintf
from tests.gateway.policy.conftest import write_policy

POLICY = """package execgate
import rego.v1
decision := {
  "out": [sprintf(c[0], c[1]) | some c in input.cases],
  "sets": [sprintf(c[0], [{x | some x in c[1]}]) | some c in input.set_cases],
}
"""

VALUES: list[Any] = [
    0, 1, -1, 7, 255, -255, 2**31, 2**53, 2**63 - 1, 2**63, -(2**63), 10**20, -(10**20),
    0.5, -0.5, 1.5, 123.456, 1e-7, 1e6, 123456.0, 1234567.0, 1e20, 1e21, 1e22, 3.0, 1e8,
    0.1, 1 / 3, 2.5e-5, -0.0, 5e-324, 1.7976931348623157e308, 0.000123, 99.99999,
    "", "a", "h\u00e9llo", "tab\there", 'q"uote', "back\\slash", "\u20ac", "\U0001f600",
    "nl\n", "\x00\x07\x7f", "\u00a0nbsp", "\u200bzw", "xxx", True, False, None, [], {},
    [1, "a", True, None], {"b": 1, "a": [2]}, {"k": {"z": None}}, [[1.5], {"x": "\u00e9"}],
]  # fmt: skip
FORMATS = [
    "%v", "%s", "%d", "%t", "%f", "%.2f", "%e", "%g", "%.3g", "%x", "%X", "%o", "%b",
    "%5d", "%-5d|", "%05d", "%+d", "% d", "%8.3f", "%-8s|", "%8s", "%.1s", "%#x", "%#o",
    "%+v", "%E", "%G", "%F", "%z", "%10v", "%.0f", "%.3d", "%05s", "% x", "%.3v", "%q",
    "%-+7.2f|", "%07.2f", "%+.3e", "%c", "%U", "%T", "%p", "%6.2v", "%#v", "%x%%",
]  # fmt: skip
MIXED = [
    ["%v %v", [1]], ["%v", [1, 2]], ["%d%%", [5]], ["no verbs", []], ["%", [1]],
    ["a %s b %d c", ["x", 2]], ["%v", []], ["%v-%v", ["x", "y", 3.5]], ["%*d", [5, 1]],
    ["%[1]d", [5]], ["%!", [1]], ["%v", [[True, {"a": None}]]], ["%s and %s", ["é", "€"]],
]  # fmt: skip
SETS = [["%v", [1, "a", 2.5]], ["%v", []], ["%s", [[1], {"a": 1}]], ["%d", [3, 1, 2]]]


def opa_eval(opa_bin: str, policy_dir: Path, doc: dict[str, Any], tmp: Path) -> Any:
    (tmp / "input.json").write_text(json.dumps(doc))
    out = subprocess.run(
        [opa_bin, "eval", "--format", "json", "-d", str(policy_dir), "-i", str(tmp / "input.json"),
         "data.execgate.decision"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return json.loads(out.stdout)["result"][0]["expressions"][0]["value"]


async def test_sprintf_formats_exactly_as_opa(opa_bin: str, tmp_path: Path) -> None:
    policy_dir = write_policy(tmp_path / "policy", POLICY)
    cases = [[f, [v]] for f in FORMATS for v in VALUES] + MIXED
    expected = await asyncio.to_thread(
        opa_eval, opa_bin, policy_dir, {"cases": cases, "set_cases": SETS}, tmp_path
    )
    engine = WasmEngine(policy_dir, timeout_ms=10_000, opa_bin=opa_bin)
    await engine.start()
    refused, differ = [], []
    try:
        for key, items in (("out", cases), ("sets", SETS)):
            for case, want in zip(items, expected[key], strict=True):
                doc = {"cases": [], "set_cases": []}
                doc["cases" if key == "out" else "set_cases"] = [case]
                try:
                    got = (await engine.decide(doc)).value[key][0]
                except PolicyEngineError as exc:
                    assert exc.kind == "invalid" and "not formatted like OPA" in exc.message
                    refused.append(case)
                    continue
                if got != want:
                    differ.append((case, want, got))
    finally:
        await engine.close()
    assert not differ, "\n".join(f"{json.dumps(c)}: OPA {w!r}, host {g!r}" for c, w, g in differ)
    # Refusing (fail closed) is kept to verbs and flags policies have no use for.
    rare = {"%q", "%c", "%U", "%T", "%p", "%#v", "%#x", "%#o", "%*d", "%[1]d"}
    assert [
        c for c in refused if c[0] not in rare and not (c[1] == [5e-324] and "x" in c[0].lower())
    ] == []
    assert len(refused) < len(cases) // 5


def test_parse_value_reads_rego_syntax() -> None:
    assert parse_value('{"a": [1, 2.5e3], "b": set()}') == {
        "a": [RegoNumber("1"), RegoNumber("2.5e3")],
        "b": RegoSet(),
    }
    parsed = parse_value('{3, "x", 1, null}')
    assert isinstance(parsed, RegoSet)
    assert parsed == (None, RegoNumber("1"), RegoNumber("3"), "x")
    assert sprintf("%v", [parsed]) == '{null, 1, 3, "x"}'
