"""Console sessions and the same-origin check, without a browser or a server."""

from __future__ import annotations

from aiohttp.test_utils import make_mocked_request

from gateway.auth.tokens import Principal
from gateway.console.guard import same_origin
from gateway.console.session import IDLE_S, MAX_AGE_S, SessionStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def principal(exp: float, scopes: str = "approvals:read exec:python") -> Principal:
    return Principal("bob", "acme", frozenset(scopes.split()), {"exp": exp, "secret": "x"})


def test_a_session_ends_with_its_token_or_after_max_age() -> None:
    clock = Clock()
    store = SessionStore(clock=clock)
    short_id, short = store.open(principal(exp=clock.now + 60))
    long_id, long = store.open(principal(exp=clock.now + 10 * MAX_AGE_S))
    assert short.expires_at == clock.now + 60
    assert long.expires_at == clock.now + MAX_AGE_S
    clock.now += 61
    assert store.get(short_id) is None
    assert store.get(long_id) is long
    clock.now += MAX_AGE_S
    assert store.get(long_id) is None


def test_a_session_keeps_only_console_scopes_and_no_claims() -> None:
    store = SessionStore(clock=Clock())
    session_id, session = store.open(principal(exp=2e9))
    assert session.scopes == {"approvals:read"}
    assert "secret" not in repr(session)
    # The store is keyed by a hash: the cookie value itself is not kept.
    assert session_id not in repr(store.__dict__)
    assert store.get(session_id) is session


def test_unknown_closed_and_empty_ids_find_nothing() -> None:
    store = SessionStore(clock=Clock())
    session_id, _ = store.open(principal(exp=2e9))
    assert store.get(None) is None
    assert store.get("") is None
    assert store.get(session_id + "x") is None
    store.close(session_id)
    assert store.get(session_id) is None
    assert len(store) == 0


def test_csrf_tokens_are_per_session_and_compared_whole() -> None:
    store = SessionStore(clock=Clock())
    _, a = store.open(principal(exp=2e9))
    _, b = store.open(principal(exp=2e9))
    assert a.csrf != b.csrf and len(a.csrf) >= 40
    assert a.csrf_ok(a.csrf)
    for wrong in (None, "", b.csrf, a.csrf[:-1], a.csrf + "x"):
        assert not a.csrf_ok(wrong)


def _req(**headers: str) -> bool:
    request = make_mocked_request("POST", "/console/signin", headers={"Host": "gw:8080", **headers})
    return same_origin(request)


def test_same_origin_needs_our_own_host() -> None:
    assert _req(Origin="http://gw:8080")
    assert _req(Origin="https://gw:8080")
    assert _req(Referer="http://gw:8080/console/approvals")
    assert not _req()  # neither header: refused, not assumed
    assert not _req(Origin="null")
    assert not _req(Origin="http://evil.example")
    assert not _req(Origin="http://gw:8081")
    assert not _req(Origin="http://gw:8080.evil.example")
    assert not _req(Referer="http://evil.example/?http://gw:8080/")
    assert not _req(Origin="javascript://gw:8080")
    # Origin wins over a forged-looking Referer.
    assert not _req(Origin="http://evil.example", Referer="http://gw:8080/console/")


def test_an_idle_session_ends_before_the_cap() -> None:
    clock = Clock()
    store = SessionStore(clock=clock)
    busy_id, busy = store.open(principal(exp=2e9))
    idle_id, _ = store.open(principal(exp=2e9))
    # Activity keeps a session alive past IDLE_S, but never past MAX_AGE_S.
    for _ in range(2):  # 2 * (IDLE_S - 1) < MAX_AGE_S
        clock.now += IDLE_S - 1
        assert store.get(busy_id) is busy
    assert store.get(idle_id) is None
    assert len(store) == 1
    clock.now = busy.expires_at
    assert store.get(busy_id) is None
    assert IDLE_S < MAX_AGE_S
