"""`--log-format json`: one JSON object per line, stable keys, JSON messages as `event`."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

from sidecar.operations.log_format import JsonFormatter


def record(message: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.LogRecord("sidecar.observe", logging.WARNING, __file__, 1, message, args,
                             exc_info)


def test_lines_are_json_objects_with_stable_keys() -> None:
    line = json.loads(JsonFormatter().format(record("queue %d full", 3)))
    assert list(line) == ["ts", "level", "logger", "message"]
    assert line["message"] == "queue 3 full" and line["level"] == "WARNING"
    assert line["ts"].endswith("Z") and len(line["ts"]) == 24


def test_json_messages_become_events_and_exceptions_are_kept() -> None:
    event = json.loads(JsonFormatter().format(record('{"event":"decision","group":"g"}')))
    assert event["event"] == {"event": "decision", "group": "g"} and "message" not in event
    failed = json.loads(JsonFormatter().format(record("skipped", exc=True)))
    assert failed["exc_type"] == "ValueError" and "boom" in failed["exc"]


def test_configure_makes_every_line_json_and_every_command_has_the_flag() -> None:
    code = ("import logging, sys; from sidecar.operations.log_format import configure; "
            "configure('info', 'json'); logging.getLogger('sidecar.x').info('hello %s', 'you')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    (line,) = done.stderr.splitlines()
    assert json.loads(line)["message"] == "hello you"
    help_text = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--help"],
                               capture_output=True, text=True, timeout=30).stdout
    assert "--log-format {text,json}" in help_text


def test_third_party_wire_loggers_stay_at_warning_whatever_the_level() -> None:
    """Issue #28, observation 4: hpack printed every decoded header (the channel token
    among them) at debug; httpx a line per request at info."""
    import logging

    from sidecar.operations.log_format import CAPPED_LOGGERS, configure

    before = logging.getLogger().level, logging.getLogger().handlers[:]
    try:
        configure("debug", "text")
        for name in CAPPED_LOGGERS:
            assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING, name
        assert not logging.getLogger("hpack.hpack").isEnabledFor(logging.DEBUG)
        configure("error", "text")
        assert logging.getLogger("httpx").getEffectiveLevel() == logging.ERROR
    finally:
        logging.getLogger().setLevel(before[0])
        logging.getLogger().handlers[:] = before[1]
