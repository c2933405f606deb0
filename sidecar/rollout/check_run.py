"""`sidecar rollout check`: send the checklist's turns through the client listener as a
caller would, read back what the gateway recorded for each, and judge it (issue 42).

Each request carries its own W3C `traceparent` whose trace id begins with the checklist's
prefix (telemetry/rows.py `CHECK_TRACE_PREFIX`): its row says `origin: rollout_check` and
is read back by that id from the admin endpoint (`GET /requests?trace=`, which finds
checklist rows only). The requests are traffic like any other: quotas, costs and
observations count them. `--url` and `--admin` must reach the same replica's gateway and
telemetry (or replicas sharing one database).

`judge` is pure (a turn, what the caller saw, the row, the rows of the item's earlier
turns → pass, fail, or None when the turn could not show what it tests); `run` does the
sending, the waiting and the reading. A row that cannot be read (the admin endpoint busy
or away past the wait) fails its turn and the check goes on.
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
POLL_S = 0.25
# How far back the admin endpoint looks for a row: a request's row is written within
# seconds of its end, and the longest request is REQUEST_TIMEOUT_S.
SINCE_S = int(REQUEST_TIMEOUT_S + ROW_WAIT_S + 60)


@dataclass(frozen=True, slots=True)
class Seen:
    """What the caller saw of one turn."""

    status: int | None      # None: no answer (the transport failed)
    message: str = ""       # the error's message, or the transport's failure
    events: int = 0         # a stream's events read before the check closed it
    finished: bool = False  # a stream that ended before its first event


@dataclass(frozen=True, slots=True)
class Verdict:
    item: str
    turn: int               # 1-based; 0 for an item that was not run
    should: str
    happened: str
    ok: bool | None         # None: not run, or could not show what it tests (said why)

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
        parts.append(f"the target selected for turn {expect.same_target_as + 1}")
    if expect.max_output_tokens is not None:
        parts.append(f"at most {expect.max_output_tokens} output tokens")
    if expect.error_class:
        parts.append(f"recorded as {expect.error_class}")
    return ", ".join(parts)


def happened_text(seen: Seen, row: dict[str, Any] | None, row_error: str = "") -> str:
    if seen.status is None:
        return f"no answer: {seen.message}"
    text = f"{seen.status}"
    if seen.status >= 400:
        text += f": {seen.message}"
    if seen.finished:
        text += f" ({seen.message})"
    if row is None:  # a refusal's row is not read back: the caller's answer is the check
        if seen.status >= 400:
            return text
        return text + (f"; its row could not be read: {row_error}" if row_error
                       else "; no row recorded in time")
    target = row.get("serving_target") or row.get("selected_target")
    if target:
        text += f" by {target}"
    for column in ("complexity", "affinity", "error_class", "output_tokens", "join_kind"):
        value = row.get(column)
        if value is not None and value != "" and (column != "join_kind" or value != "joined"):
            text += f", {column.replace('_', ' ')} {value}"
    if row.get("probe"):
        text += f", probe {row['probe']}"
    return text


def judge(turn: Turn, seen: Seen, row: dict[str, Any] | None,
          earlier: list[dict[str, Any] | None]) -> bool | None:
    """Whether what happened is what the checklist expected of this turn (None: the turn
    could not show it: a stream that ended before the check could cancel it)."""
    expect = turn.expect
    if expect.refused:
        return seen.status == 400 and expect.refusal in seen.message
    if seen.status != 200 or row is None or row.get("join_kind") != "joined":
        return False
    served = row.get("serving_target")
    if served is None or served not in expect.allowed:
        return False
    if turn.cancel:
        if row.get("error_class") == expect.error_class:
            return True
        # Recorded as answered in full: the whole stream had left Envoy before the check
        # closed it (a short reply), so this turn could not test a cancellation.
        return None if seen.finished or row.get("error_class") == "ok" else False
    status = row.get("status")
    if not (isinstance(status, int) and 200 <= status < 300):
        return False
    if expect.complexity and row.get("complexity") != expect.complexity:
        return False
    if expect.affinity and row.get("affinity") != expect.affinity:
        return False
    if expect.max_output_tokens is not None and not (
            isinstance(row.get("output_tokens"), int)
            and row["output_tokens"] <= expect.max_output_tokens):
        return False
    if expect.same_target_as is not None:
        # The pin holds the turn's *selected* primary (whoever then served it after a
        # fallback): a hit selects it again.
        before = earlier[expect.same_target_as]
        if before is None or row.get("selected_target") != before.get("selected_target"):
            return False
    return True


def new_traceparent() -> tuple[str, str]:
    """(traceparent, trace id): a fresh trace whose id carries the checklist's prefix."""
    trace_id = CHECK_TRACE_PREFIX + secrets.token_hex(12)
    return f"00-{trace_id}-{secrets.token_hex(8)}-01", trace_id


class RowUnavailable(Exception):
    """The admin endpoint did not give the row in time (busy, away, or refusing)."""


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
    clock: Callable[[], float] = time.monotonic
    transport: httpx.BaseTransport | None = None  # tests: a transport of their own

    def __post_init__(self) -> None:
        self._http = httpx.Client(timeout=REQUEST_TIMEOUT_S, transport=self.transport)

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
        return Seen(200, "the stream ended before its first event", finished=True)

    def row(self, trace_id: str) -> dict[str, Any] | None:
        """The gateway's row for the request of this trace, once it has its outcome; None
        if none was written in time. Raises RowUnavailable when the admin endpoint cannot
        answer within the wait (busy with a report, away, or refusing)."""
        headers = {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        deadline = self.clock() + self.row_wait_s
        last_problem = ""
        rows: list[dict[str, Any]] = []
        while True:
            try:
                answer = self._http.get(self.admin_url.rstrip("/") + "/requests",
                                        params={"trace": trace_id, "since": SINCE_S},
                                        headers=headers, timeout=10.0)
            except httpx.HTTPError as exc:
                last_problem = f"{type(exc).__name__}: {exc}"[:200]
            else:
                if answer.status_code == 200:
                    rows = answer.json()["rows"]
                    if rows and rows[-1].get("join_kind") != "decision_only":
                        return rows[-1]
                elif answer.status_code in (429, 503):  # busy, or its database away
                    last_problem = f"{answer.status_code}: {answer.text[:200]}"
                else:
                    raise RowUnavailable(f"the admin endpoint answered {answer.status_code}: "
                                         f"{answer.text[:200]}")
            if self.clock() >= deadline:
                if rows:
                    return rows[-1]
                if last_problem:
                    raise RowUnavailable(last_problem)
                return None
            self.sleep(POLL_S)

    def preflight(self) -> str | None:
        """Why the admin endpoint cannot serve the check's lookups, or None: asked once
        before anything is sent, so a wrong address or token costs no traffic."""
        headers = {"authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        try:
            answer = self._http.get(self.admin_url.rstrip("/") + "/requests",
                                    params={"trace": CHECK_TRACE_PREFIX + "0" * 23 + "1",
                                            "since": 1}, headers=headers, timeout=10.0)
        except httpx.HTTPError as exc:
            return f"cannot reach the admin endpoint {self.admin_url}: {type(exc).__name__}"
        if answer.status_code in (200, 429):
            return None
        return (f"the admin endpoint {self.admin_url} answered {answer.status_code} to "
                f"GET /requests: {answer.text[:200]}")


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


def run(items: list[Item], gateway: Gateway) -> list[Verdict]:
    """Every item's turns, in order; each judged on the row the gateway wrote."""
    verdicts: list[Verdict] = []
    for item in items:
        if item.skipped:
            verdicts.append(Verdict(item.name, 0, item.spec_words, item.skipped, None))
            continue
        rows: list[dict[str, Any] | None] = []
        for index, turn in enumerate(item.turns):
            if turn.wait_s:
                gateway.sleep(turn.wait_s)
            seen, trace_id = gateway.send(turn)
            row, problem = None, ""
            if seen.status is not None and seen.status < 400:  # served: read what happened
                try:
                    row = gateway.row(trace_id)
                except RowUnavailable as exc:
                    problem = str(exc)
            rows.append(row)
            ok = judge(turn, seen, row, rows)
            happened = happened_text(seen, row, problem)
            if ok is None and turn.cancel:
                happened += ("; the whole stream had left the gateway before the check "
                             "closed it, so this could not test a cancellation")
            verdicts.append(Verdict(item.name, index + 1, should_text(turn.expect),
                                    happened, ok))
    return verdicts

