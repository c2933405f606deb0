"""The response cache's parts (docs/cache.md): the store's TTL (not extended by hits) and
its bounds, what makes two requests the same, the caller's cache-control, and the slots
that tie an answer to its entry. Clocks are injected: no sleeps."""

from __future__ import annotations

import pytest

from sidecar.cache.caches import ResponseCaches
from sidecar.cache.keys import cache_directives, cache_key
from sidecar.cache.slots import Slots
from sidecar.cache.store import AnswerStore
from sidecar.config.strategy_policies import ResponseCache
from sidecar.dialects.apis import Dialect
from tests.clock import ManualClock
from tests.unit.routing.helpers import config


def test_ttl_runs_from_the_store_and_hits_do_not_extend_it() -> None:
    clock = ManualClock(1000.0)
    store = AnswerStore(ResponseCache(ttl_seconds=10), clock)
    store.put(b"k", b"answer", "application/json")
    clock.now += 9.9
    assert store.get(b"k").body == b"answer"
    clock.now += 0.1  # 10 s after the store, though hit 0.1 s ago
    assert store.get(b"k") is None
    assert (store.hits, store.misses, len(store), store.bytes) == (1, 1, 0, 0)


def test_bounds_evict_the_least_recently_used() -> None:
    store = AnswerStore(ResponseCache(max_entries=2, max_bytes=2048, max_entry_bytes=1024),
                        ManualClock(1000.0))
    store.put(b"a", b"1", "t")
    store.put(b"b", b"2", "t")
    store.get(b"a")  # b is now the least recently used
    store.put(b"c", b"3", "t")
    assert store.get(b"b") is None and store.get(b"a") is not None
    assert not store.put(b"big", b"x" * 1025, "t")  # over max_entry_bytes: not stored
    store.put(b"d", b"x" * 1024, "t")
    store.put(b"e", b"x" * 1024, "t")  # 2048 + the small ones: over max_bytes
    assert store.bytes <= 2048 and len(store) <= 2 and store.evictions >= 2


def test_two_requests_are_the_same_by_value_not_by_text() -> None:
    body = {"model": "g", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    same = {"temperature": 0, "stream": False, "messages": [{"content": "hi", "role": "user"}],
            "model": "g"}
    key = cache_key("g", "a", Dialect.OPENAI_CHAT, body)
    assert cache_key("g", "a", Dialect.OPENAI_CHAT, same) == key
    assert cache_key("g", "b", Dialect.OPENAI_CHAT, body) != key  # another caller
    assert cache_key("h", "a", Dialect.OPENAI_CHAT, body) != key  # another group
    assert cache_key("g", "a", Dialect.ANTHROPIC_MESSAGES, body) != key
    assert cache_key("g", "a", Dialect.OPENAI_CHAT, {**body, "temperature": 1}) != key


def test_shared_groups_key_without_the_caller() -> None:
    cfg = config("""
  mine:
    targets: [{provider: p, model_ref: m}]
    response_cache: {}
  ours:
    targets: [{provider: p, model_ref: m}]
    response_cache: {shared: true}
  disabled:
    targets: [{provider: p, model_ref: m}]
    response_cache: {enabled: false}
""")
    caches = ResponseCaches(cfg, 60.0)
    assert "disabled" not in caches and "mine" in caches
    body = {"model": "x", "messages": []}
    assert (caches.key("mine", "a", Dialect.OPENAI_CHAT, body)
            != caches.key("mine", "b", Dialect.OPENAI_CHAT, body))
    assert (caches.key("ours", "a", Dialect.OPENAI_CHAT, body)
            == caches.key("ours", "b", Dialect.OPENAI_CHAT, body))


@pytest.mark.parametrize(("header", "expected"), [
    ("", (True, True)), ("no-store", (False, False)), ("No-Store, max-age=0", (False, False)),
    ("no-cache", (False, True)), ("max-age=60", (True, True)),
])
def test_cache_control(header, expected) -> None:
    assert cache_directives(header) == expected


def test_slots_are_taken_once_bounded_and_expire() -> None:
    clock = ManualClock(1000.0)
    slots = Slots(max_slots=2, max_age_s=30, clock=clock)
    first = slots.reserve("g", b"k1")
    assert slots.take(first) == ("g", b"k1") and slots.take(first) is None
    a, b, c = (slots.reserve("g", key) for key in (b"a", b"b", b"c"))
    assert slots.take(a) is None and slots.dropped == 1  # the oldest went
    clock.now += 30
    assert slots.take(b) is None and slots.take(c) is None


def test_an_answer_is_stored_under_its_slot_once() -> None:
    cfg = config("  g:\n    targets: [{provider: p, model_ref: m}]\n    response_cache: {}\n")
    caches = ResponseCaches(cfg, 60.0, ManualClock(1000.0))
    key = caches.key("g", "a", Dialect.OPENAI_CHAT, {"model": "g"})
    slot = caches.slots.reserve("g", key)
    assert caches.store(slot, b"{}", "application/json")
    assert not caches.store(slot, b"{}", "application/json")
    assert caches.lookup("g", key).body == b"{}"
    assert not caches.store("unknown-slot", b"{}", "application/json")


def test_a_header_that_can_change_the_answer_is_part_of_the_key() -> None:
    """Issue #28: `anthropic-beta` reaches the provider and changes what it does, but two
    requests differing only in it shared a cached answer."""
    from sidecar.cache.keys import cache_key
    from sidecar.config import load_config_text
    from sidecar.dialects.apis import Dialect
    from sidecar.header_policy import answer_varying_headers

    body = {"model": "g", "messages": [{"role": "user", "content": "hi"}]}
    plain = cache_key("g", "c", Dialect.ANTHROPIC_MESSAGES, body)
    beta = cache_key("g", "c", Dialect.ANTHROPIC_MESSAGES, body,
                     (("anthropic-beta", "prompt-caching-2024-07-31"),))
    other = cache_key("g", "c", Dialect.ANTHROPIC_MESSAGES, body,
                      (("anthropic-beta", "output-128k-2025-02-19"),))
    assert len({plain, beta, other}) == 3
    config = load_config_text("""
providers: {p: {base_url: "http://127.0.0.1:9/v1", pass_request_headers: [x-tenant]}}
models: {g: {targets: [{provider: p, model_ref: m}]}}
""")
    assert answer_varying_headers(config) == ("anthropic-beta", "anthropic-version",
                                              "openai-beta", "x-tenant")
