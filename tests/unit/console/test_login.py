"""The console's browser login (console/login.py): the token once in a form, then a signed
cookie that never holds it; failures limited a minute."""

from __future__ import annotations

import hashlib

from sidecar.console.login import MAX_FAILURES, MAX_PEERS, SESSION_SECONDS, ConsoleLogin
from tests.clock import ManualClock

TOKEN = "admin-token-0123456789-0123456789"


def cookie_of(set_cookie: str) -> bytes:
    return set_cookie.split(";")[0].encode()


def test_the_right_token_gives_a_cookie_that_admits_until_it_expires() -> None:
    clock = ManualClock(1_000_000.0)
    login = ConsoleLogin(TOKEN, clock=clock)
    set_cookie = login.attempt(f"token={TOKEN}".encode())
    assert set_cookie is not None
    for attribute in ("HttpOnly", "SameSite=Strict", "Path=/console"):
        assert attribute in set_cookie
    assert TOKEN not in set_cookie and hashlib.sha256(TOKEN.encode()).hexdigest() not in set_cookie
    cookie = cookie_of(set_cookie)
    assert login.admits(cookie) and login.admits(b"other=1; " + cookie)
    clock.now += SESSION_SECONDS + 1
    assert not login.admits(cookie)


def test_forged_cookies_and_another_process_cookies_are_refused() -> None:
    login = ConsoleLogin(TOKEN)
    cookie = cookie_of(login.attempt(f"token={TOKEN}".encode()))
    name, _, value = cookie.decode().partition("=")
    expiry, _, mac = value.partition(".")
    for forged in (f"{name}={int(expiry) + 3600}.{mac}", f"{name}={expiry}.{'0' * 64}",
                   f"{name}=x.{mac}", f"{name}=", "", f"{name}={expiry}"):
        assert not login.admits(forged.encode()), forged
    assert not ConsoleLogin(TOKEN).admits(cookie)  # a key of its own: a restart logs out
    assert not login.admits(None)


def test_wrong_tokens_are_limited_a_minute_per_address() -> None:
    clock = ManualClock(600.0)
    login = ConsoleLogin(TOKEN, clock=clock)
    for _ in range(MAX_FAILURES):
        assert login.attempt(b"token=guess", "10.0.0.9") is None
    assert login.locked("10.0.0.9")
    # That address waits, even with the right token; another address is not locked out.
    assert login.attempt(f"token={TOKEN}".encode(), "10.0.0.9") is None
    assert not login.locked("10.0.0.7")
    assert login.attempt(f"token={TOKEN}".encode(), "10.0.0.7") is not None
    clock.now += 60
    assert not login.locked("10.0.0.9")
    assert login.attempt(f"token={TOKEN}".encode(), "10.0.0.9") is not None
    assert login.attempt(b"\xff\xfe") is None and login.attempt(b"") is None


def test_the_addresses_remembered_are_bounded() -> None:
    login = ConsoleLogin(TOKEN)
    for n in range(MAX_PEERS + 50):
        login.attempt(b"token=guess", f"peer-{n}")
    assert len(login._failures) == MAX_PEERS


def test_two_endpoints_on_one_host_keep_a_session_each() -> None:
    """Browsers keep cookies by host, not port: the name carries the port."""
    first, second = ConsoleLogin(TOKEN, 50052), ConsoleLogin(TOKEN, 50053)
    both = (cookie_of(first.attempt(f"token={TOKEN}".encode())) + b"; "
            + cookie_of(second.attempt(f"token={TOKEN}".encode())))
    assert first.admits(both) and second.admits(both)
    assert first.cookie_name != second.cookie_name
