"""What the console answers with: bytes, a content type, and the headers every console
response carries (a strict content-security policy: nothing inline, nothing from
elsewhere; no sniffing, no referrer, no caching, no framing)."""

from __future__ import annotations

from dataclasses import dataclass

SECURITY_HEADERS = (
    ("content-security-policy", "default-src 'none'; style-src 'self'; img-src 'self'; "
     "script-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
     "base-uri 'none'"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
)
HTML = "text/html; charset=utf-8"


@dataclass(frozen=True)
class Page:
    status: str
    body: bytes
    content_type: str = HTML
    headers: tuple[tuple[str, str], ...] = ()

    def head(self) -> str:
        extra = "".join(f"{name}: {value}\r\n" for name, value in
                        (*SECURITY_HEADERS, *self.headers))
        return (f"HTTP/1.1 {self.status}\r\ncontent-type: {self.content_type}\r\n"
                f"content-length: {len(self.body)}\r\n{extra}connection: close\r\n\r\n")


def redirect(location: str, *headers: tuple[str, str]) -> Page:
    return Page("303 See Other", b"", "text/plain", (("location", location), *headers))


def text_page(status: str, message: str) -> Page:
    return Page(status, message.encode(), "text/plain; charset=utf-8")
