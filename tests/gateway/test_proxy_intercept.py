"""Intercept rules: matching, JSON pointers in, answers in the upstream's shape."""

from __future__ import annotations

import pytest

from gateway.proxy_intercept import (
    _MISSING,
    answer,
    find_rule,
    get_pointer,
    request_body,
    set_pointer,
)
from gateway.settings_ingress import InterceptSettings, RouteSettings


def _route(**rule: object) -> RouteSettings:
    return RouteSettings.model_validate(
        {"prefix": "/sbx", "upstream_url": "http://127.0.0.1:1", "intercept": [rule]}
    )


def test_matching_by_method_and_path_pattern() -> None:
    route = _route(method="post", path="/sbx/v*/run")
    assert find_rule(route, "POST", "/sbx/v2/run") is not None
    assert find_rule(route, "GET", "/sbx/v2/run") is None
    assert find_rule(route, "POST", "/sbx/v2/x/run") is not None  # fnmatch "*" spans "/"
    assert find_rule(route, "POST", "/sbx/v2/run/x") is None
    assert find_rule(route, "POST", "/other/v2/run") is None


def test_pointers() -> None:
    doc = {"a": {"b/c": [10, {"~k": "v"}]}}
    assert get_pointer(doc, "/a/b~1c/1/~0k") == "v"
    assert get_pointer(doc, "/a/b~1c/0") == 10
    assert get_pointer(doc, "") == doc
    assert get_pointer(doc, "/a/missing") is _MISSING
    assert get_pointer(doc, "/a/b~1c/5") is _MISSING  # past the end of a list
    assert get_pointer({"a": None}, "/a") is None  # present, if null: not missing
    assert set_pointer({}, "/x/y", 1) == {"x": {"y": 1}}
    assert set_pointer({"x": 5}, "/x/y", 1) == {"x": {"y": 1}}


def test_request_body_from_pointers() -> None:
    rule = InterceptSettings(
        path="/x",
        language_pointer="/runtime",
        code_pointer="/files/0/content",
        stdin_pointer="/input",
    )
    body = {"runtime": "bash", "files": [{"content": "echo hi"}], "input": "data"}
    assert request_body(rule, body) == {"language": "bash", "code": "echo hi", "stdin": "data"}
    fixed = InterceptSettings(path="/x", language="python")
    assert request_body(fixed, {"language": "bash", "code": "1"})["language"] == "python"
    assert request_body(fixed, {})["code"] is None  # validation refuses it later


def test_answer_in_the_upstream_shape() -> None:
    rule = InterceptSettings(
        path="/x",
        answer_template={"object": "run", "run": {"stdout": ""}},
        answer_pointers={"stdout": "/run/stdout", "exit_code": "/run/code"},
    )
    assert answer(rule, {"stdout": "hi\n", "exit_code": 0, "stderr": "ignored"}) == {
        "object": "run",
        "run": {"stdout": "hi\n", "code": 0},
    }
    assert rule.answer_template == {"object": "run", "run": {"stdout": ""}}  # not mutated


@pytest.mark.parametrize(
    "bad",
    [
        {"code_pointer": "no-slash"},
        {"answer_pointers": {"stdout": ""}},
        {"answer_pointers": {"secret": "/x"}},
    ],
)
def test_bad_rules_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        InterceptSettings.model_validate({"path": "/x", **bad})
