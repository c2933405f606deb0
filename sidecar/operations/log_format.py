"""`--log-format json`: every sidecar log line one JSON object with stable keys.

Keys: `ts` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`; a message that
is itself a JSON object (the decision log, fallback events) is given as `event` instead of
`message`; an exception adds `exc_type` and `exc` (its traceback). The same safety rules as
the text format hold, because the lines are the same: the sidecar never logs prompts,
tokens, digests or keys in either (tests/e2e/test_canary.py reads every line).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC)
        line: dict[str, object] = {
            "ts": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "level": record.levelname,
            "logger": record.name,
        }
        message = record.getMessage()
        event = _json_object(message)
        if event is not None:
            line["event"] = event
        else:
            line["message"] = message
        if record.exc_info and record.exc_info[0] is not None:
            line["exc_type"] = record.exc_info[0].__name__
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


def _json_object(message: str) -> dict[str, object] | None:
    if not message.startswith("{"):
        return None
    try:
        value = json.loads(message)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


# Third-party loggers that print what crosses the wire at their debug (or info) level: hpack
# and h2 every decoded header — the channel token Envoy presents among them — httpx and
# httpcore each request (and, at debug, its headers: an admin or external-service token),
# asyncio the callbacks it runs. They log at WARNING and above whatever `--log-level` says,
# so no level can put a secret or a line per request into the log.
CAPPED_LOGGERS = ("hpack", "h2", "httpx", "httpcore", "asyncio", "grpc", "urllib3",
                  "psycopg", "redis")


def configure(level: str, log_format: str) -> None:
    """Root logging on stderr in the chosen format (`text` or `json`); the third-party
    loggers of CAPPED_LOGGERS at WARNING or above."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    floor = max(logging.WARNING, root.level)
    for name in CAPPED_LOGGERS:
        logging.getLogger(name).setLevel(floor)


def current() -> tuple[str, str]:
    """This process's level and format, for a child process to log the same way."""
    root = logging.getLogger()
    json_lines = any(isinstance(h.formatter, JsonFormatter) for h in root.handlers)
    return logging.getLevelName(root.level), "json" if json_lines else "text"
