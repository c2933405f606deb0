"""What a mirrored request's live answer said (issue 42, docs/rollout.md §4): how it
finished and which tools it called, read by Envoy as the answer passes and left as dynamic
metadata (`sidecar.answer`: `finish`, `tools`) for the access log, so shadow traffic can
say whether the candidate agreed with the live answer without the sidecar in the live
response path.

Lua (answer_facts.lua, after json_members.lua: JSON read as JSON), because the figures sit
in arrays (`choices[0]`, `content[]`) that Envoy's json_to_metadata and sse_to_metadata
rules cannot index. It reads copies of the chunks and edits nothing. Only requests the
sidecar mirrored carry the marker (ANSWER_FACTS_HEADER, removed before the provider); a
matcher skips the filter for every other request, so unmirrored traffic pays nothing.
Bounds: a JSON answer is read only up to MAX_ANSWER_BYTES (past it: no figures, nothing
kept), an SSE event up to MAX_EVENT_BYTES (a longer one is skipped); each chunk is
searched once. The facts are set as soon as they are read, so a caller that hangs up at
`[DONE]`, before the stream's end reaches Envoy, still leaves them.
"""

from __future__ import annotations

from functools import cache

from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpFilter,
)

from sidecar.envoy_config.lua_filters import lua_script, marked_lua_filter
from sidecar.envoy_contract import ANSWER_FACTS_HEADER

MAX_ANSWER_BYTES = 1024 * 1024
MAX_EVENT_BYTES = 64 * 1024


@cache
def answer_facts_script() -> str:
    """The Lua source Envoy runs (also what tests/unit/test_answer_facts_lua.py runs)."""
    return lua_script(("json_members.lua", "answer_facts.lua"),
                      {"MAX_ANSWER_BYTES": MAX_ANSWER_BYTES, "MAX_EVENT_BYTES": MAX_EVENT_BYTES})


def answer_facts_filter() -> HttpFilter:
    """Downstream HTTP filter, for marked requests only."""
    return marked_lua_filter("sidecar.answer_facts", ANSWER_FACTS_HEADER, answer_facts_script())
