"""Every `test_*` rule in policies/*_test.rego, run by rego-cpp, one pytest case each.

The rules are evaluated in a child process (rego-cpp can abort the process on
some Rego); if the child crashes, each test is re-run in its own child so the
crash is pinned on the test that causes it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.policies.rego_tests import RegoTest, discover

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
TESTS = discover(POLICIES)


def _run_child(names: list[str]) -> dict[str, list]:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.policies.rego_tests", str(POLICIES), *names],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode == 0:
        return json.loads(proc.stdout)
    cause = (
        signal.Signals(-proc.returncode).name if proc.returncode < 0 else f"exit {proc.returncode}"
    )
    raise RuntimeError(
        f"rego-cpp child failed ({cause}); rego-cpp 1.5 crashes on some Rego, e.g. "
        f"`with input as {{...}}` (see policies/fixtures_test.rego): {proc.stderr[-2000:]}"
    )


class _Results:
    def __init__(self) -> None:
        self._batch: dict[str, list] | None = None
        self._batch_error: str | None = None

    def get(self, test: RegoTest) -> tuple[bool, str]:
        if self._batch is None and self._batch_error is None:
            try:
                self._batch = _run_child([])
            except RuntimeError as exc:
                self._batch_error = str(exc)
        if self._batch is not None:
            if test.name not in self._batch:
                return False, "not evaluated (discovery and evaluation disagree)"
            passed, detail = self._batch[test.name]
            return passed, detail
        try:
            passed, detail = _run_child([test.name])[test.name]
        except RuntimeError as exc:
            return False, str(exc)
        return passed, detail


@pytest.fixture(scope="module")
def results() -> _Results:
    return _Results()


def test_policy_tests_exist() -> None:
    assert len(TESTS) >= 20, f"expected the default policy's unit tests, found {len(TESTS)}"


@pytest.mark.parametrize("test", TESTS, ids=[f"{t.file.name}::{t.rule}" for t in TESTS])
def test_rego(test: RegoTest, results: _Results) -> None:
    passed, detail = results.get(test)
    assert passed, f"{test.file.name}: {test.rule}: {detail}"
