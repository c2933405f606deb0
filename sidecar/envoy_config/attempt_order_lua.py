"""The attempt order rewritten where a held reply is read (the hold's Lua,
upstream_errors.py): the rules of gateway/attempt_orders.py, in Lua. A refusal goes to the
next *other* target (`other_target_next`); a 5xx, or a 429 whose `retry-after` is within
the group's wait (`earns_same_target`), puts the same target next, at most the group's
`retry_same_target` times in a row (`same_target_next`).

Envoy's priority-group cluster specifier picks attempt n's cluster as the n-th entry of
the request's `sidecar.route` metadata, read again on every retry
(docs/fallback-and-streaming.md). With `retry_same_target` the order repeats each target
(`[A, A, B]`), and a repeat is right for a failure that may not repeat (a one-off 5xx, a
reset, a 429 within its wait) but wrong for a refusal of the request itself: A would
refuse the same prompt again. So when A refuses attempt k, the entries after k that name
A are dropped and the last remaining one fills the order back to its length (Envoy's
retry count was fixed at the start; a shorter list would wrap round to A). When no other
target remains, the refusal is not retried at all: the caller gets it as sent.

The attempt's number reaches the response as `ATTEMPT_MARK_HEADER`, which the target
cluster's header-mutation filter adds from Envoy's own count (fallback.py, strip_filter)
and the response allowlist drops before the caller.
"""

from __future__ import annotations

from sidecar.envoy_contract import (
    ATTEMPT_MARK_HEADER,
    ROUTE_NAMESPACE,
    SAME_TARGET_KEY,
    SAME_TARGET_WAIT_HEADER,
    SAME_TARGET_WAIT_KEY,
)

_CHUNK = """\
local function attempt_cluster(group)
  local clusters = group["clusters"]
  return clusters and clusters[1] and clusters[1]["cluster_name"]
end

-- The reply's retry-after when it is whole seconds (as Envoy's back-off reads them) and
-- at most the group's wait, else nil.
local function wait_within(handle, headers)
  local value = headers:get("retry-after") or ""
  if string.match(value, "^[ \t]*%d+[ \t]*$") == nil then return nil end
  local route = handle:streamInfo():dynamicMetadata():get("%(namespace)s")
  local wait = route and tonumber(route["%(wait)s"] or 0) or 0
  if tonumber(value) > wait then return nil end
  return string.match(value, "%d+")
end

-- Whether a reply of this status may put its target next (attempt_orders.py,
-- earns_same_target): a 5xx; a 429 only when its retry-after is within the group's wait.
local function earns_same_target(handle, headers, status)
  if string.sub(status or "", 1, 1) == "5" and string.len(status) == 3 then return true end
  return status == "429" and wait_within(handle, headers) ~= nil
end

-- A 5xx or a 429 the provider answered: the same target next, at most the group's
-- retry_same_target times in a row; the order keeps its length. Where it is next and the
-- reply names a wait within the group's, Envoy waits that long first (the header the
-- route's rate-limited back-off reads: never before another target).
local function same_target_next(handle, headers)
  local attempt = tonumber(headers:get("%(attempt)s") or "")
  local metadata = handle:streamInfo():dynamicMetadata()
  local route = metadata:get("%(namespace)s")
  local groups = route and route["priority_groups"]
  local repeats = route and tonumber(route["%(repeats)s"] or 0) or 0
  if attempt == nil or groups == nil or repeats < 1 or groups[attempt] == nil
      or attempt >= #groups then
    return
  end
  local failed = attempt_cluster(groups[attempt])
  local run = 0
  for index = attempt, 1, -1 do
    if attempt_cluster(groups[index]) ~= failed then break end
    run = run + 1
  end
  if run > repeats then return end
  local order = {}
  for index = 1, attempt do order[index] = groups[index] end
  order[attempt + 1] = groups[attempt]
  for index = attempt + 1, #groups - 1 do order[index + 1] = groups[index] end
  metadata:set("%(namespace)s", "priority_groups", order)
  local wait = wait_within(handle, headers)
  if wait ~= nil then headers:add("%(wait_header)s", wait) end
end

-- true: retry (on another target, or as before when the order cannot be read);
-- false: no other target is left in the order.
local function other_target_next(handle, headers)
  local attempt = tonumber(headers:get("%(attempt)s") or "")
  local metadata = handle:streamInfo():dynamicMetadata()
  local route = metadata:get("%(namespace)s")
  local groups = route and route["priority_groups"]
  if attempt == nil or groups == nil or groups[attempt] == nil then return true end
  local refused = attempt_cluster(groups[attempt])
  local order, rest = {}, {}
  for index, group in ipairs(groups) do
    if index <= attempt then
      order[index] = group
    elseif attempt_cluster(group) ~= refused then
      rest[#rest + 1] = group
    end
  end
  if #rest == 0 then return false end
  for _, group in ipairs(rest) do order[#order + 1] = group end
  while #order < #groups do order[#order + 1] = rest[#rest] end
  metadata:set("%(namespace)s", "priority_groups", order)
  return true
end
"""


def attempt_order_chunk() -> str:
    """The Lua functions `earns_same_target(handle, headers, status)`,
    `same_target_next(handle, headers)` and `other_target_next(handle, headers)`."""
    return (_CHUNK.replace("%(attempt)s", ATTEMPT_MARK_HEADER)
            .replace("%(namespace)s", ROUTE_NAMESPACE).replace("%(repeats)s", SAME_TARGET_KEY)
            .replace("%(wait)s", SAME_TARGET_WAIT_KEY)
            .replace("%(wait_header)s", SAME_TARGET_WAIT_HEADER))
