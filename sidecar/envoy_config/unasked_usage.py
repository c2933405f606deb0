"""Usage the caller did not ask for, taken back out of its stream (issue #28).

An OpenAI Chat stream carries its usage only when the request asks for it
(`stream_options.include_usage`). Left to the caller, a stream without it costs no tokens
and no spend in quotas, rows and reports. So the decision asks for it on the caller's
behalf (dialects/body.py) and marks the request (USAGE_UNASKED_HEADER); Envoy's usage
reader reads the usage chunk as it passes, and this filter, after it on the response path,
removes what the caller would not have received without the gateway: the usage chunk
(`"choices":[]` with a `usage` object, sent before `[DONE]`) and the `"usage":null` that
OpenAI then adds to every other chunk (platform.openai.com/docs/api-reference/chat/create,
`stream_options`). Everything else passes byte for byte, as it arrives.

Lua, because it edits a stream's chunks as they pass without holding them: an event cut
across two chunks waits for its rest (at most one event, at most MAX_CARRY_BYTES), which
the caller could not have parsed anyway; an unfinished event at the very end of a stream is
dropped, as every SSE parser (the WHATWG rules, the OpenAI SDK) drops it. The edited
stream's length is no longer the provider's, so a declared content-length is removed.
A matcher on the marker skips the filter for every other request.
"""

from __future__ import annotations

from envoy_data_plane.envoy.config.core.v3 import DataSource
from envoy_data_plane.envoy.extensions.filters.http.lua.v3 import Lua
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)
from envoy_data_plane.google.protobuf import Any
from envoy_data_plane.xds.type.matcher.v3 import RegexMatcher, RegexMatcherGoogleRe2, StringMatcher

from sidecar.envoy_config.matchers import negated, request_header, skipped_when
from sidecar.envoy_contract import USAGE_UNASKED_HEADER

_SCRIPT = """\
-- Events end with a blank line; only whole events are edited, a cut one waits for its rest.
local function split(text)
  if string.sub(text, -2) == "\\n\\n" then return text, "" end
  local last = nil
  local from = 1
  while true do
    local found = string.find(text, "\\n\\n", from, true)
    if found == nil then break end
    last, from = found, found + 2
  end
  if last == nil then return "", text end
  return string.sub(text, 1, last + 1), string.sub(text, last + 2)
end

local function unasked(events)
  if string.find(events, '"usage"', 1, true) == nil then return events end
  local kept = {}
  for event in string.gmatch(events, "(.-\\n\\n)") do
    local is_usage_chunk = string.find(event, '"choices":[]', 1, true) ~= nil
        and string.find(event, '"usage":{', 1, true) ~= nil
    if not is_usage_chunk then
      event = string.gsub(event, ',"usage":null', "")
      kept[#kept + 1] = event
    end
  end
  return table.concat(kept)
end

function envoy_on_response(handle)
  local headers = handle:headers()
  local kind = string.lower(headers:get("content-type") or "")
  if string.find(kind, "text/event-stream", 1, true) == nil then return end
  -- The edited stream is shorter than a declared length: the caller would wait for the rest.
  headers:remove("content-length")
  local carry = ""
  for chunk in handle:bodyChunks() do
    local whole, rest = split(carry .. chunk:getBytes(0, chunk:length()))
    if #rest > %d then whole, rest = whole .. rest, "" end
    carry = rest
    chunk:setBytes(unasked(whole))
  end
end
"""
# A cut event longer than this is no usage chunk (those are a few hundred bytes): it passes
# unedited rather than be held.
MAX_CARRY_BYTES = 1024 * 1024


def unasked_usage_filter() -> HttpFilter:
    """Downstream HTTP filter; goes before the usage readers in the list (so after them on
    the response path)."""
    marked = request_header(USAGE_UNASKED_HEADER, StringMatcher(safe_regex=RegexMatcher(
        google_re2=RegexMatcherGoogleRe2(), regex=".+")))
    script = Lua(default_source_code=DataSource(inline_string=_SCRIPT % MAX_CARRY_BYTES))
    return skipped_when(negated(marked), "sidecar.strip_unasked_usage", "envoy.filters.http.lua",
                        Any.pack(script))
