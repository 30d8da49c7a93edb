"""Intercept rules: matching, JSON pointers in, answers in the upstream's shape."""

from __future__ import annotations

import pytest

from gateway.proxy.intercept import (
    _MISSING,
    AmbiguousPath,
    answer,
    checked_path,
    find_rule,
    get_pointer,
    path_rules,
    request_body,
    set_pointer,
)
from gateway.settings.ingress import InterceptSettings, RouteSettings


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


@pytest.mark.parametrize(
    "raw",
    [
        "/sbx/run;x=1",
        "/sbx/run;",
        "/sbx/run%00",
        "/sbx/run%0a",
        "/sbx%2frun",
        "/sbx%2Frun",
        "/sbx%5crun",
        "/sbx/run%3f",
        "/sbx/run%23",
        "/sbx/%2572un",  # double encoding
        "/sbx/%zzrun",
        "/sbx/run%",
        "/sbx/r%C3%BCn",
        "/sbx/%EF%BD%92un",
        "/sbx/run%c0%af",  # overlong UTF-8
        "/sbx/run%20",
        "/sbx/./run",
        "/sbx/x/../run",
        "/sbx/%2e%2e/run",
        "/sbx/run/.",
    ],
)
def test_ambiguous_paths_are_refused(raw: str) -> None:
    with pytest.raises(AmbiguousPath):
        checked_path(raw)


def test_every_plain_respelling_matches_its_rule() -> None:
    route = _route(method="POST", path="/sbx/run")
    for raw in ("/sbx/run", "/sbx/RUN", "/sbx/%72un", "/sbx//run", "/sbx/run/", "/sbx/run."):
        path = checked_path(raw)
        assert find_rule(route, "post", path) is not None, raw
        assert path_rules(route, path) and find_rule(route, "PUT", path) is None
    assert checked_path("/sbx/model:v1@x") == "/sbx/model:v1@x"


def test_a_route_needs_a_scope_and_forwards_no_credential_by_name() -> None:
    base = {"prefix": "/openai/", "upstream_url": "http://127.0.0.1:1"}
    assert RouteSettings.model_validate(base).required_scope == "proxy:openai"
    assert RouteSettings.model_validate({**base, "scope": "llm"}).required_scope == "llm"
    never = ("Cookie", "authorization", "X-Forwarded-For", "Forwarded", "X-Real-IP")
    never += ("X-Original-URL", "Content-Length", "Transfer-Encoding", "Host", "bad name")
    for name in never:
        with pytest.raises(ValueError, match="forward_headers"):
            RouteSettings.model_validate({**base, "forward_headers": [name]})
    with pytest.raises(ValueError, match="credential"):
        RouteSettings.model_validate(
            {**base, "credential_header": "X-Api-Key", "forward_headers": ["x-api-key"]}
        )
    with pytest.raises(ValueError, match="scope"):
        RouteSettings.model_validate({**base, "scope": "two words"})
