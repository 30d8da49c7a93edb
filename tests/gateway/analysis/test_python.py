"""Python analysis: imports, resolved call names and features from the AST."""

from __future__ import annotations

import pytest

from gateway.analysis import analyse


def py(code: str) -> dict:
    result = analyse("python", code)
    assert result["parsed"] is True, code[:200]
    return result


def test_alias_resolution() -> None:
    result = py("import os as y\ny.system('ls')\nimport os.path\nos.path.join('a')\n")
    assert "os.system" in result["calls"]
    assert "os.path.join" in result["calls"]
    assert result["imports"] == ["os", "os.path"]
    assert result["features"] == ["subprocess"]


def test_from_import_resolution() -> None:
    result = py("from os import system as s, popen\ns('x')\npopen('y')\n")
    assert result["calls"] == ["os.popen", "os.system"]


def test_submodule_import_reports_top_level_too() -> None:
    result = py("import ctypes.util\n")
    assert result["imports"] == ["ctypes", "ctypes.util"]
    assert result["features"] == ["native_code"]


def test_relative_and_star_imports() -> None:
    result = py("from . import x\nfrom os import *\nsystem('ls')\n")
    assert result["imports"] == ["os"]
    assert "system" in result["calls"]


def test_imports_inside_functions_count() -> None:
    assert py("def f():\n    import ctypes\n    return ctypes\n")["features"] == ["native_code"]


@pytest.mark.parametrize(
    ("code", "feature"),
    [
        ("import subprocess", "subprocess"),
        ("from subprocess import run\nrun(['ls'])", "subprocess"),
        ("import os\nos.system('ls')", "subprocess"),
        ("import os\nos.popen('ls')", "subprocess"),
        ("import os\nos.execv('/bin/sh', [])", "subprocess"),
        ("import os\nos.spawnl(0, 'x')", "subprocess"),
        ("import os\nos.fork()", "subprocess"),
        ("import pty\npty.spawn('sh')", "subprocess"),
        ("import asyncio\nasyncio.create_subprocess_exec('ls')", "subprocess"),
        ("import socket", "network"),
        ("import urllib.request", "network"),
        ("import http.client", "network"),
        ("import requests", "network"),
        ("import httpx", "network"),
        ("import aiohttp", "network"),
        ("import asyncio\nasyncio.open_connection('h', 1)", "network"),
        ("eval('1')", "dynamic_code"),
        ("exec('x = 1')", "dynamic_code"),
        ("compile('1', 'f', 'eval')", "dynamic_code"),
        ("__import__(name)", "dynamic_code"),
        ("import importlib\nimportlib.import_module(name)", "dynamic_code"),
        ("import builtins\nbuiltins.eval('1')", "dynamic_code"),
        ("getattr(obj, name)()", "dynamic_code"),
        ("import marshal", "dynamic_code"),
        ("open('f', 'w')", "filesystem_write"),
        ("open('f', mode='a')", "filesystem_write"),
        ("open('f', 'r+')", "filesystem_write"),
        ("open('f', 'xb')", "filesystem_write"),
        ("open('f', m)", "filesystem_write"),
        ("open('f', **kw)", "filesystem_write"),
        ("from pathlib import Path\nPath('x').write_text('y')", "filesystem_write"),
        ("from pathlib import Path\nPath('x').open('w')", "filesystem_write"),
        ("import os\nos.remove('x')", "filesystem_write"),
        ("import shutil\nshutil.rmtree('x')", "filesystem_write"),
        ("import ctypes", "native_code"),
        ("import _ctypes", "native_code"),
        ("from cffi import FFI", "native_code"),
        ("__import__('ctypes')", "native_code"),
        ("import importlib\nimportlib.import_module('cffi')", "native_code"),
        ("import os\nos.environ['HOME']", "environment"),
        ("import os\nos.getenv('HOME')", "environment"),
        ("import threading", "threads"),
    ],
)
def test_feature(code: str, feature: str) -> None:
    assert feature in py(code)["features"]


@pytest.mark.parametrize(
    "code",
    [
        "open('f')",
        "open('f', 'r')",
        "open('f', 'rb')",
        "from pathlib import Path\nPath('x').read_text()",
        "import os\nos.path.join('a', 'b')",
        "x = {'eval': 1}\nprint(x['eval'])",
        "import json\njson.dumps({})",
    ],
)
def test_no_feature(code: str) -> None:
    assert py(code)["features"] == []


def test_constant_dynamic_import_is_an_import() -> None:
    result = py("__import__('socket')\nimport importlib\nimportlib.import_module('ctypes')\n")
    assert {"socket", "ctypes"} <= set(result["imports"])
    assert "dynamic_code" not in result["features"]
    assert {"network", "native_code"} <= set(result["features"])


def test_getattr_with_constant_resolves() -> None:
    result = py("import os\ngetattr(os, 'system')('ls')\n")
    assert "os.system" in result["calls"]
    assert "subprocess" in result["features"]


def test_method_calls_on_calls_and_constants() -> None:
    result = py("import pathlib\npathlib.Path('x').exists()\n', '.join(['a'])\n")
    assert "pathlib.Path().exists" in result["calls"]
    assert "str.join" in result["calls"]


def test_deep_but_valid_nesting() -> None:
    code = "x = " + "[" * 100 + "]" * 100 + "\n" + "y = 1" + " + 1" * 500
    assert py(code)["calls"] == []
