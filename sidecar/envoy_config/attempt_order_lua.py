"""The attempt order rewritten where a held reply is read (the hold's Lua,
upstream_errors.py): the rules of gateway/attempt_orders.py, in Lua. A refusal goes to the
next *other* target (`other_target_next`); a 5xx or a 429 puts the same target next, at
most the group's `retry_same_target` times in a row (`same_target_next`).

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

from sidecar.envoy_contract import ATTEMPT_MARK_HEADER, ROUTE_NAMESPACE, SAME_TARGET_KEY

_CHUNK = """\
local function attempt_cluster(group)
  local clusters = group["clusters"]
  return clusters and clusters[1] and clusters[1]["cluster_name"]
end

-- A 5xx or a 429 the provider answered: the same target next, at most the group's
-- retry_same_target times in a row; the order keeps its length.
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
    """The Lua functions `same_target_next(handle, headers)` and
    `other_target_next(handle, headers)`."""
    return (_CHUNK.replace("%(attempt)s", ATTEMPT_MARK_HEADER)
            .replace("%(namespace)s", ROUTE_NAMESPACE).replace("%(repeats)s", SAME_TARGET_KEY))
