"""The attempt order rewritten by a held reply (gateway/attempt_orders.py): a refusal goes
to the next other target, a 5xx or 429 to the same target at most `retry_same_target`
times in a row; the hold's Lua does the same (envoy_config/attempt_order_lua.py, run here
through `lupa` with a stand-in handle)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lupa import LuaRuntime

from sidecar.envoy_config.attempt_order_lua import attempt_order_chunk
from sidecar.envoy_contract import ATTEMPT_MARK_HEADER, ROUTE_NAMESPACE
from sidecar.gateway.attempt_orders import order_after_failure, order_after_refusal

# A handle with what the chunk uses: headers():get, streamInfo():dynamicMetadata():get/set.
_HANDLE = """
function make_handle(clusters, attempt, repeats)
  local groups = {}
  for i, name in ipairs(clusters) do
    groups[i] = {name = "attempt" .. i, clusters = {{cluster_name = name, weight = 1}}}
  end
  local store = {["%(ns)s"] = {priority_groups = groups, same_target_retries = repeats}}
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

function run(clusters, attempt, repeats)
  local handle, headers, store = make_handle(clusters, attempt, repeats)
  local retried = true
  if repeats == nil then
    retried = other_target_next(handle, headers)
  else
    same_target_next(handle, headers)
  end
  local names = {}
  for i, group in ipairs(store["%(ns)s"].priority_groups) do
    names[i] = group.clusters[1].cluster_name
  end
  return retried, table.concat(names, ",")
end
""".replace("%(ns)s", ROUTE_NAMESPACE).replace("%(attempt)s", ATTEMPT_MARK_HEADER)


def _runtime() -> LuaRuntime:
    runtime = LuaRuntime(unpack_returned_tuples=True)
    runtime.execute(attempt_order_chunk().replace("local function other_target_next",
                                                  "function other_target_next").replace(
        "local function same_target_next", "function same_target_next"))
    runtime.execute(_HANDLE)
    return runtime


@pytest.fixture(scope="module")
def lua() -> LuaRuntime:
    return _runtime()


def lua_order(lua: LuaRuntime, order: tuple[str, ...], attempt: int,
              repeats: int | None = None) -> tuple[str, ...] | None:
    table = lua.table_from(list(order))
    retried, names = lua.globals().run(table, str(attempt), repeats)
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
    assert lua_order(_runtime(), tuple(order), attempt) == after


def test_an_order_it_cannot_read_is_retried_as_before(lua: LuaRuntime) -> None:
    assert order_after_refusal(("a", "b"), 0) == ("a", "b")
    assert lua_order(lua, ("a", "b"), 0) == ("a", "b")


@pytest.mark.parametrize(("order", "attempt", "repeats", "after"), [
    (("a", "b", "a"), 1, 1, ("a", "a", "b")),          # a one-off 500: a again first
    (("a", "a", "b"), 2, 1, ("a", "a", "b")),          # a had its retry: on to b
    (("a", "b", "c", "a"), 1, 2, ("a", "a", "b", "c")),
    (("a", "a", "b", "c"), 2, 2, ("a", "a", "a", "b")),
    (("a", "b", "a"), 1, 0, ("a", "b", "a")),          # the group does not retry a target
    (("a", "b", "a"), 3, 1, ("a", "b", "a")),          # the last attempt: nothing follows
    (("a", "b"), 2, 1, ("a", "b")),
])
def test_the_order_after_a_failure_that_may_not_repeat(
        lua: LuaRuntime, order: tuple[str, ...], attempt: int, repeats: int,
        after: tuple[str, ...]) -> None:
    assert order_after_failure(order, attempt, repeats) == after
    assert lua_order(lua, order, attempt, repeats) == after


@given(st.lists(st.sampled_from("abc"), min_size=1, max_size=6), st.integers(0, 3),
       st.data())
def test_a_target_is_never_tried_more_than_its_retries_in_a_row_and_lua_agrees(
        order: list[str], repeats: int, data: st.DataObject) -> None:
    attempt = data.draw(st.integers(1, len(order)))
    after = order_after_failure(tuple(order), attempt, repeats)
    assert len(after) == len(order) and after[:attempt] == tuple(order[:attempt])
    if after != tuple(order):
        run = 1
        while run < attempt and order[attempt - 1 - run] == order[attempt - 1]:
            run += 1
        assert after[attempt] == order[attempt - 1] and run <= repeats
    assert lua_order(_runtime(), tuple(order), attempt, repeats) == after
