"""The launcher's own start-up (backends/docker/launcher.py), run on the host's
interpreter: what it imports, how its command runs it, and its JSON helpers
against the json module's."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess

import pytest

from backends.docker import launcher
from backends.docker.config import LAUNCHER_SOURCE, launcher_command

PYTHON = "/usr/bin/python3"  # the sandbox image's interpreter is Debian's too
# Modules whose import cost every container start paid for little use (the launcher
# header says why); a request without input files needs none of them.
NOT_AT_START = {"json", "re", "enum", "signal", "contextlib", "hashlib", "selectors"}


def run_launcher(argv: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PYTHON, "-I", "-S", "-X", "importtime", *argv],
        input=stdin, capture_output=True, timeout=60, env={},
    )  # fmt: skip


def imported(stderr: bytes) -> set[str]:
    names = set()
    for line in stderr.decode().splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    return names


@pytest.fixture(scope="module")
def command() -> list[str]:
    return launcher_command(LAUNCHER_SOURCE.read_text())


def test_the_compiled_launcher_starts_without_the_costly_modules(command: list[str]) -> None:
    # No request (the host went away): it announces itself and exits 0.
    proc = run_launcher(command)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout == b"R\x00\x00\x00\x00"
    loaded = imported(proc.stderr)
    assert "os" in loaded  # the trace is there
    assert not loaded & NOT_AT_START


def test_an_interpreter_with_other_bytecode_compiles_the_source(command: list[str]) -> None:
    # Another magic number (another Python): the code is not even decoded (it is
    # not valid here, and would stop the launcher if it were).
    stub, _magic, _code, source = command[1:]
    other = ["-c", stub, "00000000", "not base64 !", source]
    proc = run_launcher(other)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert proc.stdout == b"R\x00\x00\x00\x00"


def test_a_bad_request_header_is_refused_not_run(command: list[str]) -> None:
    # Trailing bytes after the JSON value: the launcher stops before anything runs.
    body = b'{"nonce": "n"} x'
    proc = run_launcher(command, len(body).to_bytes(4, "big") + body)
    assert proc.returncode != 0
    assert b"extra data" in proc.stderr


HEADERS = [
    {"a": 1, "b": [1, 2.5, -3e-2, True, False, None], "c": {"d": "e"}},
    {"unicode": 'é \u2028 \U0001f600 \\ " \n \t \x00', "nested": [[[]], {}]},
    [],
    "plain",
    12345678901234567890,
]


@pytest.mark.parametrize("value", HEADERS)
def test_json_loads_reads_what_the_host_writes(value: object) -> None:
    for text in (
        json.dumps(value),
        json.dumps(value, ensure_ascii=False),
        json.dumps(value, indent=2),
    ):
        assert launcher.json_loads(text) == value


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} {}', '{"a": NaN}', "Infinity", "[1,]", "'a'"])
def test_json_loads_refuses_what_is_not_one_json_value(text: str) -> None:
    with pytest.raises(ValueError):
        launcher.json_loads(text)


REPORTS = [
    {"nonce": "abc", "wait_status": 0, "backstop": False, "disk_full": True, "cpu_ms": 12},
    {"nonce": "n", "setup_error": "input file 'a\"\\\n\x01\u2028\U0001f600\udc80' is odd"},
    {"nonce": "n", "wait_status": None, "max_rss_kb": 2**40},
]


@pytest.mark.parametrize("report", REPORTS)
def test_json_dumps_writes_what_the_host_reads(report: dict[str, object]) -> None:
    text = launcher.json_dumps(report)
    assert text.isascii()
    assert json.loads(text) == report
    assert text == json.dumps(report, separators=(",", ":"))


def test_input_digests_are_those_of_hashlib() -> None:
    assert launcher.sha256(b"abc").digest() == hashlib.sha256(b"abc").digest()


# Imports inside functions, which would run during a request (its latency; under gVisor,
# file lookups in the execution's syscall trace): only where the C modules are missing,
# and the gVisor proxy relay, which starts before the program does.
LATE_IMPORTS_ALLOWED = {"json_loads": {"json"}, "json_dumps": {"json"},
                        "start_relay": {"socket", "threading"}}  # fmt: skip


def test_nothing_is_imported_once_a_request_has_come() -> None:
    tree = ast.parse(LAUNCHER_SOURCE.read_text())
    late: dict[str, set[str]] = {}
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                late.setdefault(function.name, set()).update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                late.setdefault(function.name, set()).add(node.module or "")
    assert late == LATE_IMPORTS_ALLOWED
