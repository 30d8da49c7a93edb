"""Run the `test_*` rules of `policies/*_test.rego` with regopy (rego-cpp).

Discovery reads the test files (no engine needed); evaluation loads every
policy module, data document and test file into one interpreter and queries
each test rule: a test passes when the rule is exactly `true` (undefined or
anything else fails), as with `opa test`. rego-cpp can crash the process on
some Rego, so callers run `evaluate` in a child: `python -m tests.policies.rego_tests
DIR [NAME ...]` prints {name: [passed, detail]} as JSON.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

_PACKAGE_RE = re.compile(r"^package\s+([A-Za-z_][\w.]*)", re.MULTILINE)
_TEST_RE = re.compile(r"^(test_\w+)\s*(?:if\b|:=|=|\{|contains\b)", re.MULTILINE)


@dataclass(frozen=True)
class RegoTest:
    file: Path
    package: str
    rule: str

    @property
    def name(self) -> str:
        return f"{self.package}.{self.rule}"

    @property
    def query(self) -> str:
        return f"data.{self.name}"


def rego_test_files(policy_dir: Path) -> list[Path]:
    return sorted(p for p in policy_dir.rglob("*_test.rego") if p.is_file())


def discover(policy_dir: Path) -> list[RegoTest]:
    found: list[RegoTest] = []
    for file in rego_test_files(policy_dir):
        text = file.read_text(encoding="utf-8")
        package = _PACKAGE_RE.search(text)
        if package is None:
            raise ValueError(f"{file}: no package clause")
        rules = dict.fromkeys(m.group(1) for m in _TEST_RE.finditer(text))
        found += [RegoTest(file, package.group(1), rule) for rule in rules]
    return found


def evaluate(policy_dir: Path, names: list[str] | None = None) -> dict[str, tuple[bool, str]]:
    """{test name: (passed, detail)} for the tests named (default: all)."""
    from regopy import Interpreter, LogLevel
    from regopy.rego_shared import rego_free_output, rego_output_string, rego_query

    from gateway.policy.rego import format_errors
    from gateway.policy.sources import load_sources

    sources = load_sources(policy_dir)
    modules = dict(sources.modules)
    modules.update({str(f): f.read_text(encoding="utf-8") for f in rego_test_files(policy_dir)})
    rego = Interpreter()
    rego.log_level = LogLevel.NONE
    for name, text in modules.items():
        rego.add_module(name, text)
    if sources.data:
        rego.add_data_json(json.dumps(sources.data))
    tests = [t for t in discover(policy_dir) if names is None or t.name in names]
    results: dict[str, tuple[bool, str]] = {}
    for test in tests:
        impl = rego_query(rego._impl, test.query)
        try:
            text = rego_output_string(impl)
        finally:
            rego_free_output(impl)
        if text == '{"expressions":[true]}':
            results[test.name] = (True, "")
        elif text == "undefined":
            results[test.name] = (False, "undefined: some expression in the test was false")
        elif text.startswith("{"):
            results[test.name] = (False, f"evaluated to {text}")
        else:
            results[test.name] = (False, "error: " + format_errors(text, sources))
    return results


def main(argv: list[str]) -> None:
    results = evaluate(Path(argv[0]), argv[1:] or None)
    json.dump({k: list(v) for k, v in results.items()}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
