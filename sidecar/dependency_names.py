"""How log lines and errors name a service the sidecar depends on: what it is and where,
never how to log in to it.

`Redis at cache.internal:6379`, `PostgreSQL at db.internal:5432/telemetry`,
`http://10.0.0.5:9000/rank`. Passwords, user names, query strings (a `?token=`) and
fragments are left out, so a line that helps an operator find the broken dependency
cannot hand out its credentials. A string that cannot be read is named by its kind only.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, unquote, urlsplit


def redis_endpoint(url: str) -> str:
    """`Redis at host:port` of a redis:// or rediss:// URL, `Redis at socket PATH` of a
    unix:// one."""
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return f"Redis at socket {parts.path}" if parts.path else "Redis"
        return f"Redis at {_host_port(parts, 6379)}"
    except ValueError:
        return "Redis"


def postgres_endpoint(dsn: str) -> str:
    """`PostgreSQL at host:port/dbname` of a postgresql:// URI or a `key=value` connection
    string (libpq's defaults where a part is left out: the local socket, port 5432)."""
    try:
        if "://" in dsn:
            parts = urlsplit(dsn)
            where, database = _host_port(parts, 5432), unquote(parts.path.lstrip("/"))
        else:
            fields = dict(_KEYWORD.findall(dsn))
            host = _unquoted(fields.get("host", "")) or "localhost"
            port = _unquoted(fields.get("port", "")) or "5432"
            where = f"{_bracketed(host)}:{port}"
            database = _unquoted(fields.get("dbname", ""))
    except ValueError:
        return "PostgreSQL"
    return f"PostgreSQL at {where}/{database}" if database else f"PostgreSQL at {where}"


def service_url(url: str) -> str:
    """`scheme://host[:port]/path`: the URL without user, password, query or fragment."""
    try:
        parts = urlsplit(url)
        netloc = _bracketed(parts.hostname or "")
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        return "(an unreadable URL)"
    return f"{parts.scheme}://{netloc}{parts.path}"


# libpq's `keyword = value` pairs; a value is a word or a single-quoted string.
_KEYWORD = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)")


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _host_port(parts: SplitResult, default_port: int) -> str:
    host = parts.hostname or "localhost"
    return f"{_bracketed(host)}:{parts.port or default_port}"


def _bracketed(host: str) -> str:
    """An IPv6 address in brackets, so its port stays readable."""
    return f"[{host}]" if ":" in host else host
