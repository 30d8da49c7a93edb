"""JavaScript analysis: best-effort patterns, always `parsed: false`."""

from __future__ import annotations

import pytest

from gateway.analysis import analyse


def js(code: str) -> dict:
    result = analyse("javascript", code)
    assert result["parsed"] is False
    return result


def test_imports() -> None:
    code = (
        "const fs = require('fs');\n"
        'import path from "node:path";\n'
        "import { a, b } from './local.js';\n"
        "import 'side-effect';\n"
        "const m = await import(`net`);\n"
        "export { x } from 'reexported';\n"
    )
    assert js(code)["imports"] == ["./local.js", "fs", "net", "path", "reexported", "side-effect"]


def test_calls_exclude_keywords() -> None:
    calls = js("if (x) { console.log(a.b(1)); } while (y) foo();")["calls"]
    assert calls == ["a.b", "console.log", "foo"]


@pytest.mark.parametrize(
    ("code", "feature"),
    [
        ("require('child_process').execSync('ls')", "subprocess"),
        ("import { spawn } from 'node:child_process'", "subprocess"),
        ("require('net').connect(80)", "network"),
        ("require('https').get(u)", "network"),
        ("await fetch('http://x')", "network"),
        ("new WebSocket(u)", "network"),
        ("eval('1')", "dynamic_code"),
        ("new Function('return 1')", "dynamic_code"),
        ("require('vm').runInNewContext('1')", "dynamic_code"),
        ("setTimeout('alert(1)', 1)", "dynamic_code"),
        ("fs.writeFileSync('a', 'b')", "filesystem_write"),
        ("fs.createWriteStream('a')", "filesystem_write"),
        ("require('ffi-napi')", "native_code"),
        ("process.dlopen(m, f)", "native_code"),
        ("require('./addon.node')", "native_code"),
        ("process.env.HOME", "environment"),
        ("require('worker_threads')", "threads"),
    ],
)
def test_feature(code: str, feature: str) -> None:
    assert feature in js(code)["features"]


def test_plain_code_has_no_features() -> None:
    assert js("const x = [1, 2, 3].map((n) => n * 2);\nconsole.log(x);")["features"] == []
