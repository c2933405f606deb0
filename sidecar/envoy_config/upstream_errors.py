"""A provider's error that ends a request becomes the gateway's own JSON error.

When the last attempt a request may make still fails with a 429 or a 5xx, that response is
final (Envoy retried the earlier ones on the next target). Its body is the provider's: it
may be HTML from a load balancer, may name the provider's organisation or limits, and says
nothing of the attempts made. Envoy's custom-response filter replaces it, in Envoy and only
for upstream responses, with the gateway's message: how many attempts failed and the
class of the last status. The replacement is a local reply, so the local-reply mappers
(local_replies.py) put it in the caller's dialect like every other gateway error.

Status: a final 429 stays 429 (SDKs back off and retry); any final 5xx becomes 502, and so
does a provider's 401/403 (the gateway's key was refused, not the caller's token: passing
it through would make the caller's SDK blame the caller's credentials). Other 4xx are the
request's own fault and pass through unchanged.

Two more pieces keep a broken upstream reply from ending badly (docs/fallback-and-streaming.md,
"Broken replies"):

- `hold_bounded_replies`: Envoy's router commits to an attempt as soon as it sees the
  response headers, so a reply that breaks after them (a reset mid-body, invalid chunked
  framing) could never be retried. This per-attempt Lua filter holds a reply that declares
  a bounded length (and is not an event stream) until its last byte, so the router sees its
  headers only once it is complete: a reply that breaks before that is an upstream reset
  and goes to the next target like any other.
- `RESET_CLOSE_DELAY`: when Envoy cuts a response that already started (the deadline, a
  broken stream), HTTP/1.1 callers can only be told by closing the connection; Envoy's
  default delayed close (1 s) kept the socket open that long after the cut.
"""

from __future__ import annotations

from datetime import timedelta

from envoy_data_plane.envoy.config.core.v3 import (
    DataSource,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    SubstitutionFormatString,
)
from envoy_data_plane.envoy.extensions.filters.http.custom_response.v3 import CustomResponse
from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
    Config as HeaderToMetadata,
)
from envoy_data_plane.envoy.extensions.filters.http.header_to_metadata.v3 import (
    ConfigKeyValuePair,
    ConfigRule,
)
from envoy_data_plane.envoy.extensions.filters.http.lua.v3 import Lua
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.http.custom_response.local_response_policy.v3 import (
    LocalResponsePolicy,
)
from envoy_data_plane.envoy.type.matcher.v3 import (
    HttpResponseLocalReplyMatchInput,
    HttpResponseStatusCodeClassMatchInput,
    HttpResponseStatusCodeMatchInput,
)
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.core.v3 import TypedExtensionConfig
from envoy_data_plane.xds.type.matcher.v3 import (
    Matcher,
    MatcherMatcherList,
    MatcherMatcherListFieldMatcher,
    MatcherMatcherListPredicate,
    MatcherMatcherListPredicatePredicateList,
    MatcherMatcherListPredicateSinglePredicate,
    MatcherOnMatch,
    RegexMatcher,
    RegexMatcherGoogleRe2,
    StringMatcher,
)

from sidecar.envoy_config.attempt_order_lua import attempt_order_chunk
from sidecar.envoy_config.matchers import Predicate, negated, response_header, skipped_when
from sidecar.envoy_config.refusal_lua import refusal_chunk
from sidecar.envoy_contract import CONTEXT_RETRY_HEADER, UNRECOGNISED_HEADER

# Replies held in Envoy until complete: at most this many bytes, and never more than the
# per-request buffer limit (`limits.max_request_body_bytes`, which Envoy also applies to a
# held response: a held reply above it would become a 500). Longer replies, and replies of
# undeclared length (chunked), stream through unheld whatever their size.
MAX_HELD_REPLY_BYTES = 8 * 1024 * 1024

# How long Envoy waits for an HTTP/1.1 caller to close its side after Envoy cut the caller's
# response (deadline, broken stream) before closing the socket itself. Envoy's default is
# 1 s, by which every cut reached the caller a second late; 20 ms still lets a caller that
# closes at once do so first.
RESET_CLOSE_DELAY = timedelta(milliseconds=20)

# A final 429's `retry-after` reaches the caller (how long the provider asked it to wait).
KEPT_HEADERS = ("retry-after",)
KEPT_NAMESPACE = "sidecar.kept"

MESSAGE = ("No target of this model group could serve the request (attempts: "
           "%UPSTREAM_REQUEST_ATTEMPT_COUNT%; last upstream status: {status}). "
           "Try again later.")


def _single(name: str, input_config: object, match: StringMatcher) -> MatcherMatcherListPredicate:
    return MatcherMatcherListPredicate(single_predicate=MatcherMatcherListPredicateSinglePredicate(
        input=TypedExtensionConfig(name=name, typed_config=Any.pack(input_config)),
        value_match=match))


def _all(*predicates: MatcherMatcherListPredicate) -> MatcherMatcherListPredicate:
    return MatcherMatcherListPredicate(
        and_matcher=MatcherMatcherListPredicatePredicateList(predicate=list(predicates)))


def _message(status_text: str) -> SubstitutionFormatString:
    return SubstitutionFormatString(
        text_format_source=DataSource(inline_string=MESSAGE.format(status=status_text)))


def _policy(name: str, status: int, body: SubstitutionFormatString,
            kept_headers: tuple[str, ...] = ()) -> MatcherOnMatch:
    """`kept_headers`: the provider's response headers that the replacement carries on (a
    429's `retry-after`: the caller should wait as the provider asked)."""
    kept = [HeaderValueOption(header=HeaderValue(
                key=name_, value=f"%DYNAMIC_METADATA({KEPT_NAMESPACE}:{name_})%"),
                              append_action=HeaderValueOptionHeaderAppendAction.
                              OVERWRITE_IF_EXISTS_OR_ADD, keep_empty_value=False)
            for name_ in kept_headers]
    policy = LocalResponsePolicy(body_format=body, status_code=status,
                                 response_headers_to_add=kept)
    return MatcherOnMatch(action=TypedExtensionConfig(name=name, typed_config=Any.pack(policy)))


def kept_response_headers() -> HttpFilter:
    """Copies the provider headers a replacement keeps into dynamic metadata: the
    custom-response filter's replacement is a new reply, its formatter no longer sees the
    provider's headers (measured: `%RESP(retry-after)%` is empty there). Goes after
    `final_upstream_errors` in the filter list, so a response passes it first."""
    rules = [ConfigRule(header=name, on_header_present=ConfigKeyValuePair(
        metadata_namespace=KEPT_NAMESPACE, key=name)) for name in KEPT_HEADERS]
    # Only a reply the custom-response filter may replace needs it: a 2xx skips it
    # (issue #32: 46 µs of Envoy per request when it ran on every reply).
    answered = _single("status_class", HttpResponseStatusCodeClassMatchInput(),
                       StringMatcher(exact="2xx"))
    return skipped_when(answered, "sidecar.kept_response_headers",
                        "envoy.filters.http.header_to_metadata",
                        Any.pack(HeaderToMetadata(response_rules=rules)))


def final_upstream_errors() -> HttpFilter:
    from_upstream = _single("local_reply", HttpResponseLocalReplyMatchInput(),
                            StringMatcher(exact="false"))
    rate_limited = _single("status", HttpResponseStatusCodeMatchInput(),
                           StringMatcher(exact="429"))
    server_error = _single("status_class", HttpResponseStatusCodeClassMatchInput(),
                           StringMatcher(exact="5xx"))
    key_refused = MatcherMatcherListPredicate(or_matcher=MatcherMatcherListPredicatePredicateList(
        predicate=[_single("status", HttpResponseStatusCodeMatchInput(), StringMatcher(exact=code))
                   for code in ("401", "403")]))
    # The formatter only knows the new status; the message names the class it replaced.
    matchers = [
        MatcherMatcherListFieldMatcher(predicate=_all(from_upstream, rate_limited),
                                       on_match=_policy("rate_limited", 429, _message("429"),
                                                        KEPT_HEADERS)),
        MatcherMatcherListFieldMatcher(predicate=_all(from_upstream, server_error),
                                       on_match=_policy("server_error", 502, _message("5xx"))),
        MatcherMatcherListFieldMatcher(predicate=_all(from_upstream, key_refused),
                                       on_match=_policy("key_refused", 502,
                                                        _message("401/403, the gateway's "
                                                                 "provider key was refused"))),
    ]
    config = CustomResponse(custom_response_matcher=Matcher(
        matcher_list=MatcherMatcherList(matchers=matchers)))
    return HttpFilter(name="envoy.filters.http.custom_response", typed_config=Any.pack(config))


def held_reply_limit(max_request_body_bytes: int) -> int:
    """The longest reply Envoy holds until complete (see MAX_HELD_REPLY_BYTES)."""
    return min(MAX_HELD_REPLY_BYTES, max_request_body_bytes)


def digits_at_most(limit: int) -> str:
    """A regular expression whose full matches are the decimal numbers 0..limit (shorter
    numbers may have leading zeros; Envoy's regex matchers match the whole value)."""
    digits = str(limit)
    shorter = [f"[0-9]{{1,{len(digits) - 1}}}"] if len(digits) > 1 else []
    same_length = [f"{digits[:i]}[0-{int(d) - 1}][0-9]{{{len(digits) - i - 1}}}"
                   for i, d in enumerate(digits) if d != "0"]
    return "|".join([*shorter, *same_length, digits])


def length_within(limit: int) -> Predicate:
    """The response declares a content-length of at most `limit` bytes (a chunked reply
    declares none)."""
    return response_header("content-length", StringMatcher(safe_regex=RegexMatcher(
        google_re2=RegexMatcherGoogleRe2(), regex=digits_at_most(limit))))


# Lua, because no other upstream filter of Envoy 1.40 can hold a response: `body()` suspends
# the script, and with it the response headers, until the body is complete. The matcher
# around it runs it only for replies of a bounded declared length, so streams (chunked)
# never start a script.
#
# While it holds a reply the script also reads two provider behaviours (sidecar/devstack/
# provider_behaviours.py names their documents):
# - a 429 that names its wait only in OpenAI's reset headers (`x-ratelimit-reset-requests`,
#   durations such as `6m0s`) gets a `retry-after` of the earliest, so the caller of a final
#   429 and the router's back-off learn it too;
# - a 4xx that refuses the prompt as too long for the model's context window (an entry
#   of the refusal catalogue, observe/refusal_catalogue.py, scanned by refusal_lua.py) is
#   marked retriable (CONTEXT_RETRY_HEADER), so the router tries the next target, which
#   may have a larger window; a last one reaches the caller as sent;
# - in a group with `retry_same_target`, a 5xx, or a 429 whose `retry-after` (its own or
#   the one derived above) is within the group's wait, puts the same target next in the
#   request's attempt order, and a context refusal takes the refusing target out of the
#   rest of it (attempt_order_lua.py; gateway/attempt_orders.py has the rules);
# - a refusal status no entry knows gets UNRECOGNISED_HEADER (its error's type and code,
#   tokens only), which the per-attempt access log carries to the sidecar's counter
#   (observe/access_log.py); the response allowlist drops both before the caller.
_HOLD_SCRIPT = """\
local UNITS = {h = 3600, m = 60, s = 1, ms = 0.001, us = 0.000001}

local function seconds(text)
  local total, found = 0, false
  for number, unit in string.gmatch(text, "([%d%.]+)(%a+)") do
    local scale, value = UNITS[unit], tonumber(number)
    if scale == nil or value == nil then return nil end
    total, found = total + value * scale, true
  end
  if found then return total end
  return tonumber(text)
end

%(refusals)s
%(order)s
function envoy_on_response(handle)
  local kind = string.lower(handle:headers():get("content-type") or "")
  if string.find(kind, "text/event-stream", 1, true) ~= nil then return end
  local body = handle:body()
  -- A handle taken before body() is out of scope after it: take the headers again.
  local headers = handle:headers()
  local status = headers:get(":status")
  local derive = status == "429" and headers:get("retry-after") == nil
  if derive then
    local wait = nil
    for _, name in ipairs({"x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"}) do
      local value = headers:get(name)
      local s = value and seconds(value)
      if s ~= nil and s >= 0 and (wait == nil or s < wait) then wait = s end
    end
    if wait ~= nil then headers:add("retry-after", string.format("%d", math.ceil(wait))) end
  end
  if earns_same_target(handle, headers, status) then
    same_target_next(handle, headers)
  end
  if not derive and body ~= nil and string.sub(status or "", 1, 1) == "4" then
    local text = string.lower(body:getBytes(0, math.min(body:length(), REFUSAL_SCANNED + 1)))
    local verdict = refusal_verdict(status, text)
    if verdict == "context_window" then
      if other_target_next(handle, headers) then
        headers:add("%(header)s", "context_window")
      end
    elseif verdict == nil and REFUSAL_STATUSES[status] then
      headers:add("%(unrecognised)s", unrecognised_mark(text))
    end
  end
end
""".replace("%(header)s", CONTEXT_RETRY_HEADER).replace(
    "%(unrecognised)s", UNRECOGNISED_HEADER).replace("%(refusals)s", refusal_chunk()).replace(
    "%(order)s", attempt_order_chunk())


def hold_bounded_replies(limit: int) -> HttpFilter:
    """Upstream (per-attempt) HTTP filter of a target cluster; goes before the others."""
    script = Lua(default_source_code=DataSource(inline_string=_HOLD_SCRIPT))
    return skipped_when(negated(length_within(limit)), "sidecar.hold_bounded_replies",
                        "envoy.filters.http.lua", Any.pack(script))
