"""analyse(): the policy input's `analysis` section, for any input at all."""

from __future__ import annotations

import pytest

from gateway.analysis import DEFAULT_MAX_CHARS, FEATURES, analyse, analyse_request

KEYS = {"parsed", "imports", "calls", "features"}


def check_shape(result: dict) -> None:
    assert set(result) == KEYS
    assert isinstance(result["parsed"], bool)
    for key in ("imports", "calls", "features"):
        assert result[key] == sorted(set(result[key])), key
        assert all(isinstance(item, str) for item in result[key])
    assert set(result["features"]) <= set(FEATURES)


@pytest.mark.parametrize("language", ["python", "bash", "javascript", "ruby", ""])
@pytest.mark.parametrize(
    "code",
    [
        "",
        "\x00",
        "print(1)\x00",
        "x = '\ud800'",
        "\udcff\udcfe",
        "(" * 100_000,
        "[" * 5_000 + "]" * 5_000,
        "x = " + "+".join(["1"] * 100_000),
        "x = a" + ".b" * 100_000,
        "-" * 200_000 + "1",
        "not " * 100_000 + "1",
        "lambda: " * 10_000 + "1",
        "$(" * 5_000 + ")" * 5_000,
        "`" * 10_001,
        '"' * 10_001,
        "<<EOF\n" * 1_000,
        "\n" * 100_000,
        "é€😀" * 10_000,
    ],
    ids=lambda code: repr(code[:12]) + f"x{len(code)}",
)
def test_hostile_input_never_raises(language: str, code: str) -> None:
    check_shape(analyse(language, code))


def test_huge_code_is_scanned_not_parsed() -> None:
    code = "import ctypes\n" + "x = 1\n" * (5 * 1024 * 1024 // 6)
    result = analyse("python", code)
    check_shape(result)
    assert result["parsed"] is False
    assert "native_code" in result["features"]
    assert result["imports"] == ["ctypes"]


def test_padding_does_not_hide_a_feature() -> None:
    padded = "# " + "x" * DEFAULT_MAX_CHARS + "\nimport socket\nsocket.socket()\n"
    assert analyse("python", padded)["parsed"] is False
    assert "network" in analyse("python", padded)["features"]
    assert analyse("python", "import socket\nsocket.socket()\n")["parsed"] is True


def test_max_chars_is_adjustable() -> None:
    assert analyse("python", "import os\n", max_chars=3)["parsed"] is False
    assert analyse("python", "import os\n", max_chars=100)["parsed"] is True


def test_syntax_error_still_described() -> None:
    result = analyse("python", "import ctypes\ndef broken(:\n")
    assert result["parsed"] is False
    assert result["features"] == ["native_code"]


def test_unknown_language_is_scanned() -> None:
    result = analyse("ruby", "require 'socket'\nsystem('ls')\n")
    assert result["parsed"] is False
    assert result["features"] == ["network", "subprocess"]


def test_lists_are_bounded() -> None:
    code = "\n".join(f"import m{i}\nf{i}()" for i in range(2_000))
    result = analyse("python", code)
    assert result["parsed"] is True
    assert len(result["imports"]) == 256
    assert len(result["calls"]) == 512


def test_clean_code_has_no_features() -> None:
    assert analyse("python", "print(sum(range(10)))") == {
        "parsed": True,
        "imports": [],
        "calls": ["print", "range", "sum"],
        "features": [],
    }


# --- input files: what the program can load counts as what it does -----------------


@pytest.mark.parametrize(
    ("language", "files", "feature"),
    [
        ("python", [("helper.py", b"import ctypes\n")], "native_code"),
        ("python", [("pkg/mod.py", b"import socket\n")], "network"),
        ("bash", [("lib.sh", b"curl http://127.0.0.1/\n")], "network"),
        ("bash", [("tool", b"#!/usr/bin/env python3\nimport subprocess\n")], "subprocess"),
        ("bash", [("tool", b"#!/usr/bin/python3.11 -I\nimport ctypes\n")], "native_code"),
        ("python", [("helper.pyc", b"\x00\x01")], "dynamic_code"),
        ("python", [("helper.abi3.so", b"")], "native_code"),
        ("python", [("libx.so.1", b"")], "native_code"),
        ("python", [("payload", b"\x7fELF\x02\x01\x01")], "native_code"),
        ("python", [("run.txt", b"import ctypes\n")], "native_code"),  # valid Python
        ("javascript", [("m.mjs", b"require('child_process')\n")], "subprocess"),
    ],
)
def test_input_files_add_their_features(
    language: str, files: list[tuple[str, bytes]], feature: str
) -> None:
    result = analyse_request(language, "", files)
    check_shape(result)
    assert feature in result["features"], result


def test_data_files_are_not_code() -> None:
    files = [
        ("data.csv", b"module,ctypes\nsystem,fork\n"),
        ("README", b"We never use ctypes or socket here.\n"),
        ("blob.bin", bytes(range(256))),
    ]
    result = analyse_request("python", "print(1)", files)
    check_shape(result)
    assert result["features"] == [] and result["parsed"] is True


def test_padding_past_the_budget_hides_no_file() -> None:
    pad = ("pad.py", b"x = 1\n" * 100)
    hidden = ("later.txt", b"import ctypes\n")
    result = analyse_request("python", "", [pad, hidden], max_chars=100)
    assert "native_code" in result["features"]
    # The code's own verdict is not changed by its files.
    assert analyse_request("python", "def (", [("ok.py", b"x = 1")])["parsed"] is False
