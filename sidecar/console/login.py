"""The console's login for browsers (docs/console.md §Access).

A browser cannot send `authorization: Bearer` on a navigation, so where the admin
endpoint has a token the console takes it once, in a form POST (never a query parameter:
it would land in history and proxy logs), and answers with a cookie that holds an expiry
and an HMAC of it under a key drawn at start. The token itself is never in the cookie,
the key never leaves the process (a restart logs everyone out), and cookies are checked
in constant time. The cookie's name carries the endpoint's port: browsers keep cookies by
host, not port, so two sidecars on one host (two port-forwards) keep a session each.

Failed logins are limited per peer address: `MAX_FAILURES` a minute, then that address's
logins are refused until the minute ends (a peer cannot guess at speed, and a peer that
guesses cannot lock out another address). At most `MAX_PEERS` addresses are remembered
(the oldest forgotten first).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import parse_qs

SESSION_SECONDS = 8 * 3600
MAX_FAILURES = 10
MAX_PEERS = 1024
MAX_FORM_BYTES = 4096


class ConsoleLogin:
    def __init__(self, token: str, port: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self._token = token.encode()
        self._key = secrets.token_bytes(32)
        self._clock = clock
        self.cookie_name = f"sidecar_console_{port}"
        # peer address → (minute, failures in it)
        self._failures: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def attempt(self, form: bytes, peer: str = "") -> str | None:
        """The `set-cookie` value for a form holding the right token; None otherwise."""
        if self.locked(peer):
            return None
        try:
            values = parse_qs(form.decode("utf-8"), max_num_fields=4)
        except (UnicodeDecodeError, ValueError):
            values = {}
        given = (values.get("token") or [""])[0].encode()
        if not hmac.compare_digest(given, self._token):
            self._failed(peer)
            return None
        expiry = int(self._clock()) + SESSION_SECONDS
        return (f"{self.cookie_name}={expiry}.{self._sign(expiry)}; Path=/console; HttpOnly; "
                f"SameSite=Strict; Max-Age={SESSION_SECONDS}")

    def locked(self, peer: str = "") -> bool:
        minute, failures = self._failures.get(peer, (-1, 0))
        return minute == int(self._clock() // 60) and failures >= MAX_FAILURES

    def _failed(self, peer: str) -> None:
        minute = int(self._clock() // 60)
        last, failures = self._failures.pop(peer, (minute, 0))
        self._failures[peer] = (minute, failures + 1 if last == minute else 1)
        while len(self._failures) > MAX_PEERS:
            self._failures.popitem(last=False)

    def admits(self, cookie_header: bytes | None) -> bool:
        """Whether any of the request's cookies of this endpoint's name is a valid session."""
        if not cookie_header:
            return False
        for part in cookie_header.decode("latin-1").split(";"):
            name, _, value = part.strip().partition("=")
            if name != self.cookie_name:
                continue
            expiry, _, mac = value.partition(".")
            if not (expiry.isascii() and expiry.isdigit() and len(expiry) <= 12):
                continue
            if int(expiry) < self._clock():
                continue
            if hmac.compare_digest(mac.encode(), self._sign(int(expiry)).encode()):
                return True
        return False

    def _sign(self, expiry: int) -> str:
        return hmac.new(self._key, str(expiry).encode(), hashlib.sha256).hexdigest()
