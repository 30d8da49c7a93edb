from __future__ import annotations

import pytest

from backends.egress.rules import Rules


@pytest.mark.parametrize(
    ("host", "port", "rule"),
    [
        ("api.example.com", 443, "api.example.com:443"),
        ("API.Example.com.", 443, "api.example.com:443"),
        ("api.example.com", 80, None),
        ("a.example.org", 8443, "*.example.org:*"),
        ("a.b.example.org", 1, "*.example.org:*"),
        ("example.org", 443, None),  # the suffix itself is not below it
        ("badexample.org", 443, None),
        ("127.0.0.1", 8080, "127.0.0.1:8080"),
        ("127.0.0.10", 8080, None),
    ],
)
def test_match(host: str, port: int, rule: str | None) -> None:
    rules = Rules(["api.example.com:443", "*.example.org:*", "127.0.0.1:8080"])
    assert rules.match(host, port) == rule


def test_empty_list_allows_nothing() -> None:
    assert Rules().match("localhost", 80) is None
