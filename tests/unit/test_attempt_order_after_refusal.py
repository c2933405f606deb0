"""A refusal goes to the next other target: the rest of the attempt order without the
refusing target (gateway/reply_gate.py), and the hold's Lua does the same
(envoy_config/attempt_order_lua.py, run here through `lupa` with a stand-in handle)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lupa import LuaRuntime

from sidecar.envoy_config.attempt_order_lua import attempt_order_chunk
from sidecar.envoy_contract import ATTEMPT_MARK_HEADER, ROUTE_NAMESPACE
from sidecar.gateway.reply_gate import order_after_refusal

# A handle with what the chunk uses: headers():get, streamInfo():dynamicMetadata():get/set.
_HANDLE = """
function make_handle(clusters, attempt)
  local groups = {}
  for i, name in ipairs(clusters) do
    groups[i] = {name = "attempt" .. i, clusters = {{cluster_name = name, weight = 1}}}
  end
  local store = {["%(ns)s"] = {priority_groups = groups}}
  local metadata = {
    get = function(self, ns) return store[ns] end,
    set = function(self, ns, key, value) store[ns][key] = value end,
  }
  local info = {dynamicMetadata = function(self) return metadata end}
  local handle = {streamInfo = function(self) return info end}
  local headers = {get = function(self, name)
    if name == "%(attempt)s" then return attempt end
    return nil
  end}
  return handle, headers, store
end

function run(clusters, attempt)
  local handle, headers, store = make_handle(clusters, attempt)
  local retried = other_target_next(handle, headers)
  local names = {}
  for i, group in ipairs(store["%(ns)s"].priority_groups) do
    names[i] = group.clusters[1].cluster_name
  end
  return retried, table.concat(names, ",")
end
""".replace("%(ns)s", ROUTE_NAMESPACE).replace("%(attempt)s", ATTEMPT_MARK_HEADER)


@pytest.fixture(scope="module")
def lua() -> LuaRuntime:
    runtime = LuaRuntime(unpack_returned_tuples=True)
    runtime.execute(attempt_order_chunk().replace("local function other_target_next",
                                                  "function other_target_next"))
    runtime.execute(_HANDLE)
    return runtime


def lua_order(lua: LuaRuntime, order: tuple[str, ...], attempt: int) -> tuple[str, ...] | None:
    table = lua.table_from(list(order))
    retried, names = lua.globals().run(table, str(attempt))
    return tuple(names.split(",")) if retried else None


@pytest.mark.parametrize(("order", "attempt", "after"), [
    (("a", "a", "b"), 1, ("a", "b", "b")),        # retry_same_target: 1
    (("a", "a", "b", "b"), 1, ("a", "b", "b", "b")),
    (("a", "b", "a"), 1, ("a", "b", "b")),        # round again: never back to a
    (("a", "a", "b", "b"), 3, None),              # b refused too: nobody left
    (("a", "a"), 1, None),                        # a lone target is not asked again
    (("b", "a", "a"), 2, None),
    (("a", "b", "c"), 1, ("a", "b", "c")),
])
def test_the_order_after_a_refusal(lua: LuaRuntime, order: tuple[str, ...], attempt: int,
                                   after: tuple[str, ...] | None) -> None:
    assert order_after_refusal(order, attempt) == after
    assert lua_order(lua, order, attempt) == after


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=6), st.data())
def test_never_the_refusing_target_again_and_the_same_answer_in_lua(order: list[str],
                                                                    data: st.DataObject) -> None:
    attempt = data.draw(st.integers(1, len(order)))
    after = order_after_refusal(tuple(order), attempt)
    if after is not None:
        assert len(after) == len(order) and after[:attempt] == tuple(order[:attempt])
        assert order[attempt - 1] not in after[attempt:]
    else:
        assert set(order[attempt:]) <= {order[attempt - 1]}
    runtime = LuaRuntime(unpack_returned_tuples=True)
    runtime.execute(attempt_order_chunk().replace("local function other_target_next",
                                                  "function other_target_next"))
    runtime.execute(_HANDLE)
    assert lua_order(runtime, tuple(order), attempt) == after


def test_an_order_it_cannot_read_is_retried_as_before(lua: LuaRuntime) -> None:
    assert order_after_refusal(("a", "b"), 0) == ("a", "b")
    assert lua_order(lua, ("a", "b"), 0) == ("a", "b")
