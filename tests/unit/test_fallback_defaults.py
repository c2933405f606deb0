"""The failover defaults of issue 40 (docs/fallback-and-streaming.md, "Defaults"): streams
commit at their first event, a failure that may not repeat earns the same target once more,
and a 429 earns it only when its `retry-after` is within the group's wait — in the config,
in the hold's Lua (run through `lupa` with a stand-in handle) and in the reply gate."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from lupa import LuaRuntime

from sidecar.config.fallback_policy import DEFAULT_ROUTE_CLASS, Fallback
from sidecar.config.loading import load_config_file, load_config_text
from sidecar.envoy_config.addresses import EnvoyAddresses
from sidecar.envoy_config.render import render_envoy_yaml
from sidecar.envoy_config.upstream_errors import _HOLD_SCRIPT
from sidecar.envoy_contract import (
    ATTEMPT_MARK_HEADER,
    CONTEXT_RETRY_HEADER,
    ROUTE_NAMESPACE,
    SAME_TARGET_KEY,
    SAME_TARGET_WAIT_HEADER,
    SAME_TARGET_WAIT_KEY,
)
from sidecar.gateway.attempt_orders import (
    AttemptOrder,
    earns_same_target,
    retry_after_seconds,
)
from sidecar.gateway.reply_gate import FirstEventGate, Release, Retry, UndeclaredLengthGate

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ORDER = ("a", "b", "a")


def test_the_defaults() -> None:
    fallback = Fallback()
    assert fallback.commit_at_first_event is True
    assert fallback.retry_same_target == 1
    assert fallback.wait_for_retry_after_seconds == 2.0
    assert fallback.first_token_timeout_seconds is None
    assert fallback.first_event_wait_seconds == fallback.per_try_timeout_seconds == 300
    assert fallback.route_class == DEFAULT_ROUTE_CLASS  # the catch-all route


def test_the_wait_is_coupled_to_same_target_retries_only_where_set() -> None:
    """`retry_same_target: 0` alone loads (the wait's default is ignored, and no route waits
    before another target); a wait set beside it is still refused."""
    alone = Fallback(retry_same_target=0)
    assert alone.same_target_wait_seconds == 0 and alone.route_class.rate_limit_wait_s == 0
    with pytest.raises(ValueError, match="needs retry_same_target"):
        Fallback(retry_same_target=0, wait_for_retry_after_seconds=3)
    assert Fallback(retry_same_target=0, wait_for_retry_after_seconds=0).route_class != (
        DEFAULT_ROUTE_CLASS)
    with pytest.raises(ValueError, match="needs commit_at_first_event"):
        Fallback(commit_at_first_event=False, first_token_timeout_seconds=1)
    assert Fallback(commit_at_first_event=False).first_event_wait_seconds == 300


def test_groups_where_a_commit_or_a_retry_means_nothing_load_and_render() -> None:
    """A single-target group, a bridged one, a hedging one and one that turns it all off,
    beside the SPEC sample (which must load verbatim), all with the defaults."""
    groups = """\
lone: {targets: [{provider: openai, model_ref: m}]}
bridged:
  bridges: true
  targets: [{provider: openai, model_ref: m}, {provider: anthropic, model_ref: c}]
hedged:
  hedge: {}
  targets: [{provider: openai, model_ref: m}, {provider: openai, model_ref: n}]
unguarded:
  fallback: {commit_at_first_event: false, retry_same_target: 0, max_attempts: 1}
  targets: [{provider: openai, model_ref: m}]
"""
    spec = (FIXTURES / "spec_sample.yaml").read_text()
    config = load_config_text(spec + textwrap.indent(groups, "  "))
    document = yaml.safe_load(render_envoy_yaml(config, EnvoyAddresses()))
    clusters = {c["name"] for c in document["static_resources"]["clusters"]}
    assert {"target__lone__0__openai", "target__hedged__1__openai"} <= clusters
    assert config.route_class_name("lone") == config.route_class_name("hedged") == ""
    assert config.models["lone"].fallback.attempt_order(["x"]) == ["x", "x"]
    assert config.models["unguarded"].fallback.attempt_order(["x"]) == ["x"]
    assert load_config_file(FIXTURES / "spec_sample.yaml").models[
        "adaptive-agent"].fallback.commit_at_first_event


# What the hold's Lua does with a held reply: headers, body, the request's metadata.
_HANDLE = """
function make(status, header_pairs, body, clusters, attempt, repeats, wait)
  local held = {[":status"] = status, ["%(attempt)s"] = attempt}
  for i = 1, #header_pairs, 2 do held[header_pairs[i]] = header_pairs[i + 1] end
  local groups = {}
  for i, name in ipairs(clusters) do
    groups[i] = {name = "attempt" .. i, clusters = {{cluster_name = name, weight = 1}}}
  end
  local store = {["%(ns)s"] = {priority_groups = groups, ["%(repeats)s"] = repeats,
                               ["%(wait)s"] = wait}}
  local metadata = {
    get = function(self, ns) return store[ns] end,
    set = function(self, ns, key, value) store[ns][key] = value end,
  }
  local headers = {
    get = function(self, name) return held[name] end,
    add = function(self, name, value) held[name] = value end,
  }
  local data = {length = function(self) return #body end,
                getBytes = function(self, from, n) return string.sub(body, from + 1, from + n) end}
  local handle = {
    headers = function(self) return headers end,
    body = function(self) return data end,
    streamInfo = function(self) return {dynamicMetadata = function(s) return metadata end} end,
  }
  return handle, held, store
end

function hold(status, header_pairs, body, clusters, attempt, repeats, wait)
  local handle, held, store = make(status, header_pairs, body, clusters, attempt, repeats, wait)
  envoy_on_response(handle)
  local names = {}
  for i, group in ipairs(store["%(ns)s"].priority_groups) do
    names[i] = group.clusters[1].cluster_name
  end
  return table.concat(names, ","), held["retry-after"], held["%(retry)s"],
         held["%(wait_header)s"]
end
""".replace("%(ns)s", ROUTE_NAMESPACE).replace("%(attempt)s", ATTEMPT_MARK_HEADER).replace(
    "%(repeats)s", SAME_TARGET_KEY).replace("%(wait)s", SAME_TARGET_WAIT_KEY).replace(
    "%(retry)s", CONTEXT_RETRY_HEADER).replace("%(wait_header)s", SAME_TARGET_WAIT_HEADER)


@pytest.fixture(scope="module")
def lua() -> LuaRuntime:
    runtime = LuaRuntime(unpack_returned_tuples=True)
    runtime.execute(_HOLD_SCRIPT)
    runtime.execute(_HANDLE)
    return runtime


Held = tuple[tuple[str, ...], str | None, str | None]  # order, retry-after, Envoy's wait


def held_by_lua(lua: LuaRuntime, status: int, headers: dict[str, str], body: bytes = b"{}",
                repeats: int = 1, wait: float = 2.0) -> Held:
    pairs = lua.table_from([item for pair in headers.items() for item in pair])
    names, retry_after, _, waited = lua.globals().hold(
        str(status), pairs, body.decode(), lua.table_from(list(ORDER)), "1", repeats, wait)
    return tuple(names.split(",")), retry_after, waited


def held_by_gate(status: int, headers: dict[str, str], body: bytes = b"{}",
                 repeats: int = 1, wait: float = 2.0) -> Held:
    gate = UndeclaredLengthGate({":status": str(status), ATTEMPT_MARK_HEADER: "1", **headers},
                                AttemptOrder(ORDER, repeats, wait))
    release = gate.body(body, True, 0.0)
    order = release.attempt_order.clusters if release.attempt_order else ORDER
    added = dict(release.set_headers)
    return (order, added.get("retry-after", headers.get("retry-after")),
            added.get(SAME_TARGET_WAIT_HEADER))


CASES = [
    # (status, headers, repeats, wait, the order after attempt 1 of [a, b, a])
    (500, {}, 1, 2.0, ("a", "a", "b")),                       # a one-off 500: a again
    (529, {"retry-after": "30"}, 1, 2.0, ("a", "a", "b")),    # a 5xx may not repeat
    (429, {"retry-after": "2"}, 1, 2.0, ("a", "a", "b")),     # within the wait: a again
    (429, {"retry-after": "0"}, 1, 2.0, ("a", "a", "b")),
    (429, {"retry-after": "3"}, 1, 2.0, ("a", "b", "a")),     # longer: b at once
    (429, {}, 1, 2.0, ("a", "b", "a")),                       # no wait named: b at once
    (429, {"retry-after": "1.5"}, 1, 2.0, ("a", "b", "a")),   # not Envoy's seconds
    (429, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 1, 2.0, ("a", "b", "a")),
    (429, {"x-ratelimit-reset-requests": "1s"}, 1, 2.0, ("a", "a", "b")),  # derived: 1
    (429, {"x-ratelimit-reset-tokens": "6m0s"}, 1, 2.0, ("a", "b", "a")),  # derived: 360
    (429, {"retry-after": "2"}, 1, 0.0, ("a", "b", "a")),     # the group waits for none
    (429, {"retry-after": "2"}, 0, 2.0, ("a", "b", "a")),     # the group never repeats
    (500, {}, 0, 2.0, ("a", "b", "a")),
    (400, {"retry-after": "1"}, 1, 2.0, ("a", "b", "a")),     # the caller's own error
]


@pytest.mark.parametrize(("status", "headers", "repeats", "wait", "after"), CASES)
def test_what_earns_the_same_target_next_in_the_hold_and_in_the_gate(
        lua: LuaRuntime, status: int, headers: dict[str, str], repeats: int, wait: float,
        after: tuple[str, ...]) -> None:
    """Issue 40: a 429 that names no wait, or a longer one than the group waits, goes to
    the next target at once (it was put next again after Envoy's 25 ms back-off)."""
    assert held_by_lua(lua, status, headers, repeats=repeats, wait=wait)[0] == after
    assert held_by_gate(status, headers, repeats=repeats, wait=wait)[0] == after


WAITS = [
    # (status, headers, what Envoy's back-off waits before the next attempt)
    (429, {"retry-after": "2"}, "2"),                       # the same target, after 2 s
    (429, {"retry-after": " 1 "}, "1"),
    (429, {"x-ratelimit-reset-requests": "1s"}, "1"),
    (503, {"retry-after": "1"}, "1"),
    (503, {}, None),                                        # Envoy's short back-off
    (529, {"retry-after": "30"}, None),                     # longer than the group waits
    (429, {"retry-after": "3"}, None),                      # another target: never waits
]


@pytest.mark.parametrize(("status", "headers", "waited"), WAITS)
def test_envoy_waits_only_before_the_same_target(lua: LuaRuntime, status: int,
                                                 headers: dict[str, str],
                                                 waited: str | None) -> None:
    """Issue 40: the route's rate-limited back-off reads SAME_TARGET_WAIT_HEADER, which
    only a reply whose target is next carries; it used to read `retry-after`, so a
    target's second 429 delayed the *next* target by its wait."""
    assert held_by_lua(lua, status, headers)[2] == waited
    assert held_by_gate(status, headers)[2] == waited
    # The target's second 429 in a row: the next target is tried without waiting.
    pairs = lua.table_from(["retry-after", "2"])
    names, _, _, second = lua.globals().hold("429", pairs, "{}", lua.table_from(
        ["a", "a", "b"]), "2", 1, 2.0)
    assert (names, second) == ("a,a,b", None)


def test_the_retry_after_the_hold_derives_is_the_one_it_judges(lua: LuaRuntime) -> None:
    assert held_by_lua(lua, 429, {"x-ratelimit-reset-requests": "1s"})[1] == "1"
    assert held_by_gate(429, {"x-ratelimit-reset-requests": "1s"})[1] == "1"
    assert held_by_lua(lua, 429, {"x-ratelimit-reset-requests": "1.2s"})[1] == "2"


def test_a_context_refusal_still_goes_to_the_next_other_target(lua: LuaRuntime) -> None:
    body = json.dumps({"error": {"message": "This model's maximum context length is 8 tokens",
                                 "type": "invalid_request_error",
                                 "code": "context_length_exceeded"}}).encode()
    pairs = lua.table_from([])
    names, _, mark, _ = lua.globals().hold("400", pairs, body.decode(),
                                        lua.table_from(list(ORDER)), "1", 1, 2.0)
    assert (names, mark) == ("a,b,b", "context_window")


@pytest.mark.parametrize("value", [None, "", "2", " 2\t", "02", "1.5", "-1", "²", "2s",
                                   "Wed, 21 Oct 2015 07:28:00 GMT"])
@pytest.mark.parametrize("status", [429, 500, 503, 400, 200])
def test_lua_and_python_agree_on_every_retry_after(lua: LuaRuntime, value: str | None,
                                                   status: int) -> None:
    headers = {} if value is None else {"retry-after": value}
    python = earns_same_target(status, retry_after_seconds(value), 2.0)
    assert (held_by_lua(lua, status, headers)[0] == ("a", "a", "b")) == python


def test_an_in_band_error_is_judged_like_its_http_status() -> None:
    """The first-event gate: an in-band overload (529) earns the same target; an in-band
    rate limit names no wait, so it goes to the next target."""
    order = AttemptOrder(ORDER, 1, 2.0)
    overloaded = (b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error",'
                  b'"message":"Overloaded"}}\n\n')
    verdict = FirstEventGate({ATTEMPT_MARK_HEADER: "1"}, order).body(overloaded, False)
    assert isinstance(verdict, Retry) and verdict.status == 529
    assert verdict.attempt_order is not None
    assert verdict.attempt_order.clusters == ("a", "a", "b")
    limited = overloaded.replace(b"overloaded_error", b"rate_limit_error")
    verdict = FirstEventGate({ATTEMPT_MARK_HEADER: "1"}, order).body(limited, False)
    assert isinstance(verdict, Retry) and verdict.status == 429
    assert verdict.attempt_order is None
    assert isinstance(FirstEventGate({}, order).body(b'data: {"x": 1}\n\n', False), Release)
