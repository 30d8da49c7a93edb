"""The conservative text scan used for code that is not parsed."""

from __future__ import annotations

from gateway.analysis.textscan import scan


def test_words_not_substrings() -> None:
    assert scan("python", "import ctypes").features == {"native_code"}
    assert scan("python", "my_ctypes_helper = 1").features == set()


def test_native_modules_named() -> None:
    assert scan("python", "x = _ctypes; y = cffi").imports == {"_ctypes", "cffi"}


def test_substrings() -> None:
    assert scan("bash", "exec 3<>/dev/tcp/h/1").features >= {"network"}


def test_redirect_only_for_bash() -> None:
    assert "filesystem_write" in scan("bash", "echo x >f").features
    assert scan("python", "x > 1").features == set()
    assert scan("bash", "ls 2>&1").features == set()


def test_never_parsed() -> None:
    assert scan("python", "").parsed is False
