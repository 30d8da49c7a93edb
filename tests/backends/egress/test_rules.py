from __future__ import annotations

import pytest

from backends.egress.rules import Rule, Rules


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


@pytest.mark.parametrize(
    ("host", "port", "rule"),
    [
        ("10.1.2.3", 5432, "10.1.2.3:5432"),
        ("10.1.2.4", 5432, None),
        ("10.200.0.9", 443, "10.0.0.0/8:443"),
        ("::1", 8080, "[::1]:8080"),
        ("0:0::1", 8080, "[::1]:8080"),
        ("fd00::5", 443, "[fc00::/7]:443"),
        ("::ffff:10.1.2.3", 5432, None),  # another address than 10.1.2.3
        ("db.example.test", 5432, "*:*"),  # `*` is any name...
        ("192.0.2.1", 5432, None),  # ...and no literal
    ],
)
def test_literal_and_cidr_entries(host: str, port: int, rule: str | None) -> None:
    rules = Rules(["10.1.2.3:5432", "10.0.0.0/8:443", "[::1]:8080", "[fc00::/7]:443", "*:*"])
    assert rules.match(host, port) == rule


@pytest.mark.parametrize(
    "entry",
    ["10.0.0.1/8:443", "[10.0.0.1]:80", "::1:80", "*.10.0.0.1:80", "127.1:80", "h:0", "h",
     "[::1]80", "\uff48.example:80"],
)  # fmt: skip
def test_malformed_entries_refused(entry: str) -> None:
    with pytest.raises(ValueError):
        Rule.parse(entry)
    assert Rules([entry, "*:*"]).rules == Rules(["*:*"]).rules  # skipped: matches nothing
