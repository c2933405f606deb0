"""The console's login for browsers (docs/console.md §Access).

A browser cannot send `authorization: Bearer` on a navigation, so beyond loopback the
console takes the admin token once, in a form POST (never a query parameter: it would
land in history and proxy logs), and answers with a cookie that holds an expiry and an
HMAC of it under a key drawn at start. The token itself is never in the cookie, the key
never leaves the process (a restart logs everyone out), and cookies are checked in
constant time. Failed logins are limited: `MAX_FAILURES` a minute for the whole endpoint,
then every login is refused until the minute ends (one peer cannot guess at speed).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from urllib.parse import parse_qs

COOKIE = "sidecar_console"
SESSION_SECONDS = 8 * 3600
MAX_FAILURES = 10
MAX_FORM_BYTES = 4096


class ConsoleLogin:
    def __init__(self, token: str, clock: Callable[[], float] = time.time) -> None:
        self._token = token.encode()
        self._key = secrets.token_bytes(32)
        self._clock = clock
        self._failures: tuple[int, int] = (0, 0)  # (minute, failures in it)

    def attempt(self, form: bytes) -> str | None:
        """The `set-cookie` value for a form holding the right token; None otherwise."""
        minute = int(self._clock() // 60)
        if self._failures[0] == minute and self._failures[1] >= MAX_FAILURES:
            return None
        try:
            values = parse_qs(form.decode("utf-8"), max_num_fields=4)
        except (UnicodeDecodeError, ValueError):
            values = {}
        given = (values.get("token") or [""])[0].encode()
        if not hmac.compare_digest(given, self._token):
            count = self._failures[1] + 1 if self._failures[0] == minute else 1
            self._failures = (minute, count)
            return None
        expiry = int(self._clock()) + SESSION_SECONDS
        return (f"{COOKIE}={expiry}.{self._sign(expiry)}; Path=/console; HttpOnly; "
                f"SameSite=Strict; Max-Age={SESSION_SECONDS}")

    @property
    def locked(self) -> bool:
        minute = int(self._clock() // 60)
        return self._failures[0] == minute and self._failures[1] >= MAX_FAILURES

    def admits(self, cookie_header: bytes | None) -> bool:
        if not cookie_header:
            return False
        for part in cookie_header.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name != COOKIE:
                continue
            expiry, _, mac = value.partition(".")
            if not (expiry.isascii() and expiry.isdigit() and len(expiry) <= 12):
                return False
            if int(expiry) < self._clock():
                return False
            return hmac.compare_digest(mac.encode(), self._sign(int(expiry)).encode())
        return False

    def _sign(self, expiry: int) -> str:
        return hmac.new(self._key, str(expiry).encode(), hashlib.sha256).hexdigest()
