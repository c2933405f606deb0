"""Usage the caller did not ask for, taken back out of its stream (issues #28, #40).

An OpenAI Chat stream carries its usage only when the request asks for it
(`stream_options.include_usage`). Left to the caller, a stream without it costs no tokens
and no spend in quotas, rows and reports. So the decision asks for it on the caller's
behalf (dialects/body.py) and marks the request (USAGE_UNASKED_HEADER); Envoy's usage
reader reads the usage chunk as it passes, and this filter, after it on the response path,
removes what the caller would not have received without the gateway: the usage chunk (a
top-level `choices` that is an empty array and a `usage` that is an object) and the
`"usage": null` that OpenAI then adds to every other chunk
(platform.openai.com/docs/api-reference/chat/create, `stream_options`).

The script (json_members.lua, then unasked_usage.lua) reads each event's data as JSON, not
as byte patterns: any spacing, key order, escapes (`"us\\u0061ge"`), data split over several
`data:` lines, CRLF or CR line ends, events cut across writes or several in one. Everything
else passes byte for byte, as it arrives, except that the chunk carrying a `finish_reason`
waits for the next event: when that is the usage chunk, the members the usage chunk has and
the final chunk lacks (llama.cpp's `timings`, which it moves there when usage is asked) go
into the final chunk before its closing brace, so the caller's last chunk is what the
provider would have sent it; never the usage chunk's identity (id, object, created, model,
system_fingerprint), which the final chunk has its own of. docs/observations.md, "The
unasked usage chunk", states the rules.

Lua, because it edits a stream's chunks as they pass without holding them. Bounds: an event
cut across two chunks waits for its rest (at most one event, at most MAX_CARRY_BYTES; a
longer one passes unedited), and the final chunk waits only if it is at most MAX_HELD_BYTES
(a longer one passes at once and the usage chunk's extra members are dropped with it). An
unfinished event at the very end of a stream is dropped, as every SSE parser (the WHATWG
rules, the OpenAI SDK) drops it. The edited stream's length is no longer the provider's, so
a declared content-length is removed. A matcher on the marker skips the filter for every
other request.
"""

from __future__ import annotations

from functools import cache

from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)

from sidecar.envoy_config.lua_filters import lua_script, marked_lua_filter
from sidecar.envoy_contract import USAGE_UNASKED_HEADER

# A cut event longer than this is no usage chunk (those are a few hundred bytes): it passes
# unedited rather than be held.
MAX_CARRY_BYTES = 1024 * 1024
# The final chunk (a few hundred bytes; some providers put their last text in it) waits for
# the usage chunk only up to this size.
MAX_HELD_BYTES = 64 * 1024


@cache
def unasked_usage_script() -> str:
    """The Lua source Envoy runs (also what tests/unit/test_unasked_usage_lua.py runs)."""
    return lua_script(("json_members.lua", "unasked_usage.lua"),
                      {"MAX_CARRY_BYTES": MAX_CARRY_BYTES, "MAX_HELD_BYTES": MAX_HELD_BYTES})


def unasked_usage_filter() -> HttpFilter:
    """Downstream HTTP filter; goes before the usage readers in the list (so after them on
    the response path)."""
    return marked_lua_filter("sidecar.strip_unasked_usage", USAGE_UNASKED_HEADER,
                             unasked_usage_script())
