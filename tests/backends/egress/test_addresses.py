"""Which hosts are literals, which are names, and which addresses are internal."""

from __future__ import annotations

import ipaddress

import pytest

from backends.egress.addresses import (
    BAD_HOST,
    NONCANONICAL_ADDRESS,
    DestinationError,
    SystemResolver,
    is_internal,
    is_localhost_name,
    parse_destination,
)

INTERNAL = [
    "127.0.0.1", "127.255.255.254", "0.0.0.0", "0.1.2.3", "10.0.0.1", "172.16.5.4",
    "172.31.255.255", "192.168.1.1", "100.64.0.1", "100.127.255.254", "169.254.169.254",
    "192.0.0.170", "198.18.0.1", "224.0.0.1", "239.255.255.250", "240.0.0.1",
    "255.255.255.255",
    "::", "::1", "fc00::1", "fd12:3456::1", "fe80::1", "fec0::1", "ff02::1", "100::1",
    "::ffff:127.0.0.1", "::ffff:10.1.2.3", "::ffff:169.254.169.254",  # IPv4-mapped
    "::127.0.0.1", "::10.0.0.1",  # IPv4-compatible
    "::ffff:0:127.0.0.1",  # SIIT-translated
    "64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b:1::1",  # NAT64
    "2002:7f00:1::1", "2002:a9fe:a9fe::",  # 6to4 of 127.0.0.1, 169.254.169.254
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
]  # fmt: skip
# Documentation ranges stand in for the public internet in tests; not refused.
PUBLIC = ["192.0.2.10", "198.51.100.7", "203.0.113.9", "2001:db8::7", "::ffff:192.0.2.10",
          "64:ff9b::192.0.2.10", "2002:c000:20a::1", "100.128.0.1", "172.32.0.1"]  # fmt: skip


@pytest.mark.parametrize("text", INTERNAL)
def test_internal(text: str) -> None:
    assert is_internal(ipaddress.ip_address(text))


@pytest.mark.parametrize("text", PUBLIC)
def test_public(text: str) -> None:
    assert not is_internal(ipaddress.ip_address(text))


@pytest.mark.parametrize(
    ("host", "literal"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("::1", "::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("::FFFF:127.0.0.1", "::ffff:7f00:1"),
        ("Example.COM.", None),
        ("a_b.example.test", None),
        ("localhost", None),
    ],
)
def test_literals_and_names(host: str, literal: str | None) -> None:
    dest = parse_destination(host)
    assert (str(dest.address) if dest.address else None) == literal
    if literal is None:
        assert dest.host == host.lower().rstrip(".")


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        # What inet_aton (and so getaddrinfo) or a URL parser reads as 127.0.0.1.
        ("127.1", NONCANONICAL_ADDRESS),
        ("127.0.1", NONCANONICAL_ADDRESS),
        ("2130706433", NONCANONICAL_ADDRESS),
        ("0x7f.1", NONCANONICAL_ADDRESS),
        ("0X7F000001", NONCANONICAL_ADDRESS),
        ("0177.0.0.1", NONCANONICAL_ADDRESS),
        ("127.000.000.001", NONCANONICAL_ADDRESS),
        ("1.2.3.4.5", NONCANONICAL_ADDRESS),
        ("evil.example.0x7f", NONCANONICAL_ADDRESS),
        # Not hostnames: IDN U-labels (idna would map fullwidth to ASCII), escapes,
        # zones, empty labels, spaces.
        ("\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54", BAD_HOST),  # fullwidth
        ("\uff11\uff12\uff17.0.0.1", BAD_HOST),
        ("xn--lcalhost-\u00f6", BAD_HOST),
        ("127%2e0%2e0%2e1", BAD_HOST),
        ("fe80::1%eth0", BAD_HOST),
        ("::1%lo", BAD_HOST),
        ("a..b", BAD_HOST),
        ("127.0.0.1..", BAD_HOST),
        ("", BAD_HOST),
        ("a b", BAD_HOST),
        ("-x.example", BAD_HOST),
        ("[::1]", BAD_HOST),
    ],
)
def test_ambiguous_hosts_refused(host: str, rule: str) -> None:
    with pytest.raises(DestinationError) as caught:
        parse_destination(host)
    assert caught.value.rule == rule


def test_localhost_names() -> None:
    assert is_localhost_name("localhost") and is_localhost_name("db.localhost")
    assert not is_localhost_name("localhost.example.org") and not is_localhost_name("xlocalhost")


async def test_system_resolver_answers_addresses() -> None:
    # Numeric hosts: getaddrinfo answers without asking any DNS server.
    assert await SystemResolver().resolve("127.0.0.1", 80) == (ipaddress.ip_address("127.0.0.1"),)
    assert await SystemResolver().resolve("::1", 80) == (ipaddress.ip_address("::1"),)
