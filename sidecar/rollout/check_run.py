"""`sidecar rollout check`: send the checklist's turns through the client listener as a
caller would, read back what the gateway recorded for each, and judge it (issue 42).

Each request carries its own W3C `traceparent` whose trace id begins with the checklist's
prefix (telemetry/rows.py `CHECK_TRACE_PREFIX`): its row is read back by that id from the
admin endpoint (`GET /requests?trace=`) and says `origin: rollout_check`. The requests are
traffic like any other: quotas, costs and observations count them.

`judge` is pure (a turn, what the caller saw, the row, the rows of the item's earlier
turns → a verdict); `run` does the sending, the waiting and the reading.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from sidecar.rollout.checklist import Expect, Item, Turn
from sidecar.telemetry.rows import CHECK_TRACE_PREFIX

ROW_WAIT_S = 20.0     # how long a row may take to be written (access log, then a batch)
REQUEST_TIMEOUT_S = 120.0
# How far back the admin endpoint looks for a row (it scans that span's rows): a request's
# row is written within seconds of its end; the longest request is REQUEST_TIMEOUT_S.
SINCE_S = int(REQUEST_TIMEOUT_S + ROW_WAIT_S + 60)


@dataclass(frozen=True, slots=True)
class Seen:
    """What the caller saw of one turn."""

    status: int | None      # None: no answer (the transport failed)
    message: str = ""       # the error's message, or the transport's failure
    events: int = 0         # a stream's events read before the check closed it


@dataclass(frozen=True, slots=True)
class Verdict:
    item: str
    turn: int               # 1-based; 0 for an item that was not run
    should: str
    happened: str
    ok: bool | None         # None: not run (said why in `happened`)

    def as_dict(self) -> dict[str, Any]:
        return {"item": self.item, "turn": self.turn, "should": self.should,
                "happened": self.happened,
                "result": "skipped" if self.ok is None else ("pass" if self.ok else "fail")}


def should_text(expect: Expect) -> str:
    if expect.refused:
        return f"refused (400): {expect.refusal}"
    parts = ["served by " + (" or ".join(sorted(expect.allowed)) if len(expect.allowed) < 4
                             else f"one of {len(expect.allowed)} eligible targets")]
    if expect.complexity:
        parts.append(f"complexity {expect.complexity}")
    if expect.affinity:
        parts.append(f"affinity {expect.affinity}")
    if expect.same_target_as is not None:
        parts.append(f"same target as turn {expect.same_target_as + 1}")
    if expect.error_class:
        parts.append(f"recorded as {expect.error_class}")
    return ", ".join(parts)


def happened_text(seen: Seen, row: dict[str, Any] | None) -> str:
    if seen.status is None:
        return f"no answer: {seen.message}"
    text = f"{seen.status}"
    if seen.status >= 400:
        text += f": {seen.message}"
    if row is None:  # a refusal's row is not read back: the caller's answer is the check
        return text if seen.status >= 400 else text + "; no row recorded in time"
    target = row.get("serving_target") or row.get("selected_target")
    if target:
        text += f" by {target}"
    for column in ("complexity", "affinity", "error_class"):
        if row.get(column):
            text += f", {column} {row[column]}"
    if row.get("probe"):
        text += f", probe {row['probe']}"
    return text


def judge(turn: Turn, seen: Seen, row: dict[str, Any] | None,
          earlier: list[dict[str, Any] | None]) -> bool:
    """Whether what happened is what the checklist expected of this turn."""
    expect = turn.expect
    if expect.refused:
        return seen.status == 400 and expect.refusal in seen.message
    if seen.status != 200 or row is None:
        return False
    target = row.get("serving_target") or row.get("selected_target")
    if target not in expect.allowed:
        return False
    if expect.complexity and row.get("complexity") != expect.complexity:
        return False
    if expect.affinity and row.get("affinity") != expect.affinity:
        return False
    if expect.error_class and row.get("error_class") != expect.error_class:
        return False
    if expect.same_target_as is not None:
        before = earlier[expect.same_target_as]
        if before is None or target != (before.get("serving_target")
                                        or before.get("selected_target")):
            return False
    return True


def new_traceparent() -> tuple[str, str]:
    """(traceparent, trace id): a fresh trace whose id carries the checklist's prefix."""
    trace_id = CHECK_TRACE_PREFIX + secrets.token_hex(12)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01", trace_id


@dataclass
class Gateway:
    """The live gateway as the check reaches it: its client listener, as each caller, and
    its admin endpoint, for the rows."""

    url: str                              # the client listener, e.g. http://127.0.0.1:10000
    admin_url: str                        # the sidecar's admin endpoint
    tokens: tuple[str, str | None]        # the first caller's token, the second's
    admin_token: str | None = None
    row_wait_s: float = ROW_WAIT_S
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        self._http = httpx.Client(timeout=REQUEST_TIMEOUT_S)

    def close(self) -> None:
        self._http.close()

    def send(self, turn: Turn) -> tuple[Seen, str]:
        token = self.tokens[1] if turn.second_caller else self.tokens[0]
        traceparent, trace_id = new_traceparent()
        headers = {"authorization": f"Bearer {token}", "traceparent": traceparent}
        endpoint = self.url.rstrip("/") + "/v1/chat/completions"
        try:
            if turn.cancel:
                return self._cancel_after_first_event(endpoint, turn.body, headers), trace_id
            reply = self._http.post(endpoint, json=turn.body, headers=headers)
        except httpx.HTTPError as exc:
            return Seen(None, f"{type(exc).__name__}: {exc}"[:200]), trace_id
        return Seen(reply.status_code, _message(reply)), trace_id

    def _cancel_after_first_event(self, endpoint: str, body: dict[str, Any],
                                  headers: dict[str, str]) -> Seen:
        with self._http.stream("POST", endpoint, json=body, headers=headers) as reply:
            if reply.status_code != 200:
                reply.read()
                return Seen(reply.status_code, _message(reply))
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    return Seen(200, events=1)  # leaving the block closes the stream
        return Seen(200, "the stream ended before its first event")

    def row(self, trace_id: str) -> dict[str, Any] | None:
        """The gateway's row for the request of this trace, once it has its outcome."""
        headers = {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        deadline = time.monotonic() + self.row_wait_s
        while True:
            answer = self._http.get(self.admin_url.rstrip("/") + "/requests",
                                    params={"trace": trace_id, "since": SINCE_S},
                                    headers=headers)
            if answer.status_code != 200:
                raise ValueError(f"the admin endpoint answered {answer.status_code} to "
                                 f"GET /requests: {answer.text[:200]}")
            rows = answer.json()["rows"]
            if rows and rows[-1].get("join_kind") != "decision_only":
                return rows[-1]
            if time.monotonic() >= deadline:
                return rows[-1] if rows else None
            self.sleep(0.2)


def _message(reply: httpx.Response) -> str:
    """The error's message from an OpenAI-shaped error body (the gateway's, or the
    provider's passed through)."""
    if reply.status_code < 400:
        return ""
    try:
        error = reply.json().get("error")
    except (ValueError, AttributeError):
        return reply.text[:200]
    if isinstance(error, dict):
        return str(error.get("message", ""))[:500]
    return json.dumps(error)[:200]


def run(items: list[Item], gateway: Gateway, ttl_seconds: float) -> list[Verdict]:
    """Every item's turns, in order; each judged on the row the gateway wrote."""
    verdicts: list[Verdict] = []
    for item in items:
        if item.skipped:
            verdicts.append(Verdict(item.name, 0, item.spec_words, item.skipped, None))
            continue
        rows: list[dict[str, Any] | None] = []
        for index, turn in enumerate(item.turns):
            if turn.wait_ttl:
                gateway.sleep(ttl_seconds + 1.0)
            seen, trace_id = gateway.send(turn)
            row = None if turn.expect.refused else gateway.row(trace_id)
            rows.append(row)
            verdicts.append(Verdict(item.name, index + 1, should_text(turn.expect),
                                    happened_text(seen, row), judge(turn, seen, row, rows)))
    return verdicts
