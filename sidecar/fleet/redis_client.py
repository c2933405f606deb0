"""One way to open the Redis the quotas and the fleet share: short timeouts and no retries
inside a round (the next round is the retry), and errors that never quote the URL (it may
hold a password)."""

from __future__ import annotations

from typing import Any

# No round waits longer for Redis than this; a slower round counts as Redis down.
ROUND_TIMEOUT_S = 2.0


def redis_client(url: str, setting: str) -> Any:
    """`setting` names the configuration field in errors (`quotas.redis_url`)."""
    try:
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
    except ImportError:
        raise ValueError(f"{setting} needs the redis package: install "
                         "model-group-sidecar[redis]") from None
    try:
        return redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                    retry=Retry(NoBackoff(), 0))
    except ValueError:
        raise ValueError(f"{setting} is not a valid redis:// or rediss:// URL") from None


def as_text(value: bytes | str) -> str:
    """A stream name or entry id as redis-py returns it (bytes without decoding)."""
    return value.decode() if isinstance(value, bytes) else value
