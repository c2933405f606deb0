"""`affinity`: TTL, FIFO eviction, isolation, eligibility always wins, no raw text kept."""

from __future__ import annotations

import pickle
from dataclasses import replace

from sidecar.dialects.apis import Dialect
from sidecar.dialects.conversation import conversation_key
from sidecar.routing.affinity import AffinityStore
from sidecar.routing.router import Router
from tests.clock import ManualClock
from tests.unit.routing.helpers import config, request, snapshot, warm


def test_ttl_expires_at_exactly_ttl_seconds_and_hits_do_not_extend_it() -> None:
    clock = ManualClock()
    store = AffinityStore(ttl_seconds=600, max_entries=10, clock=clock)
    store.pin(b"k", 1)
    for now in (0, 100, 599.999):
        clock.now = now
        assert store.lookup(b"k") == (1, False)   # hits along the way
    clock.now = 600
    assert store.lookup(b"k") == (1, True)        # expired exactly at ttl_seconds
    store.pin(b"k", 2)                            # replaced: TTL starts again
    clock.now = 1199.9
    assert store.lookup(b"k") == (2, False)


def test_capacity_evicts_the_oldest_created_even_if_it_is_hit_most() -> None:
    clock = ManualClock()
    store = AffinityStore(ttl_seconds=600, max_entries=3, clock=clock)
    for key in (b"a", b"b", b"c"):
        store.pin(key, 0)
    for _ in range(100):
        store.lookup(b"a")                        # popular, but oldest
    store.pin(b"d", 0)
    assert store.digests() == [b"b", b"c", b"d"]
    store.pin(b"b", 1)                            # replacing makes it the newest
    store.pin(b"e", 0)
    assert store.digests() == [b"d", b"b", b"e"]


def test_a_hundred_thousand_conversations_keep_exactly_max_entries() -> None:
    store = AffinityStore(ttl_seconds=600, max_entries=10_000, clock=ManualClock())
    for i in range(100_000):
        store.pin(i.to_bytes(32, "big"), i % 3)
    assert len(store) == 10_000
    assert store.digests()[0] == (90_000).to_bytes(32, "big")


GROUP = """
  g:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a, weight: 1, tags: [tool_capable, vision],
         pricing: {input_per_mtok: 1, output_per_mtok: 1}}
      - {provider: p, model_ref: b, weight: 1, tags: [tool_capable, vision],
         pricing: {input_per_mtok: 1, output_per_mtok: 1}}
      - {provider: p, model_ref: c, weight: 1, tags: [tool_capable, vision],
         pricing: {input_per_mtok: 1, output_per_mtok: 1}}
      - {provider: q, model_ref: plain, weight: 1,
         pricing: {input_per_mtok: 1000, output_per_mtok: 1000}}
    routing_policy:
      dynamic_score:
        affinity: {ttl_seconds: 600, max_entries: 100}
        thresholds: {max_error_rate: 0.03}
"""


def conversation(text: str = "Fix my bug", caller: str = "alice",
                 dialect: Dialect = Dialect.OPENAI_CHAT, **shape):
    payload = {"messages": [{"role": "user", "content": text}]}
    return request(caller=caller, dialect=dialect,
                   conversation_key=conversation_key(caller, "g", dialect, payload), **shape)


def test_turns_of_a_conversation_stay_on_the_first_selected_target() -> None:
    router = Router(config(GROUP), clock=ManualClock())
    first = router.decide(conversation())
    assert first.trace.affinity == "miss_created"
    later = [router.decide(conversation()) for _ in range(20)]
    assert {d.primary.target.model_ref for d in later} == {first.primary.target.model_ref}
    assert {d.trace.affinity for d in later} == {"hit"}
    # Other conversations still spread by the rotation.
    others = {router.decide(conversation(f"other {i}")).primary.target.model_ref
              for i in range(8)}
    assert len(others) >= 3


def test_callers_and_dialects_are_isolated() -> None:
    router = Router(config(GROUP), clock=ManualClock())
    alice = router.decide(conversation(caller="alice"))
    bob = router.decide(conversation(caller="bob"))
    assert bob.trace.affinity == "miss_created" and alice.trace.affinity == "miss_created"
    assert router.decide(conversation(dialect=Dialect.ANTHROPIC_MESSAGES)).trace.affinity == (
        "miss_created")


def test_expired_pin_is_reselected_and_replaced_with_a_new_ttl() -> None:
    clock = ManualClock()
    router = Router(config(GROUP), clock=clock)
    router.decide(conversation())
    clock.now = 600
    assert router.decide(conversation()).trace.affinity == "expired_replaced"
    clock.now = 1199
    assert router.decide(conversation()).trace.affinity == "hit"


def pinned_target(router: Router) -> str:
    return router.decide(conversation()).primary.target.model_ref


def test_current_eligibility_wins_for_tools_modality_api_shape_and_spend() -> None:
    """The conversation is pinned to `plain` (no tool or image support, expensive, and its
    provider speaks only OpenAI Chat); each change of the request moves it and repins."""
    changes = {
        "tools": {"has_tools": True},
        "modality": {"has_images": True},
        "api_shape": {"dialect": Dialect.ANTHROPIC_MESSAGES},
        "spend_ceiling": {"spend_ceiling_usd": 0.01},
    }
    for name, shape in changes.items():
        router = Router(config(GROUP), clock=ManualClock())
        key = conversation().conversation_key
        router.affinity_store("g").pin(key, 3)
        assert pinned_target(router) == "plain", name
        moved = router.decide(replace(conversation(), **shape))
        assert moved.primary.target.model_ref != "plain", name
        assert moved.trace.affinity == "ineligible_replaced", name
        assert router.affinity_store("g").lookup(key)[0] == moved.primary.index, name


def test_health_threshold_moves_a_pinned_conversation() -> None:
    router = Router(config(GROUP), clock=ManualClock())
    first = router.decide(conversation())
    label = first.primary.label.replace("/", "__")
    sick = router.decide(conversation(), snapshot(**{label: warm(error_rate=0.5)}))
    assert sick.primary.target.model_ref != first.primary.target.model_ref
    assert sick.trace.affinity == "ineligible_replaced"


def test_no_repin_after_a_successful_fallback() -> None:
    """The pin is the primary chosen before any upstream result: a fallback serving the
    request (even observed as such) does not move the conversation."""
    router = Router(config(GROUP), clock=ManualClock())
    first = router.decide(conversation())
    label = first.primary.label.replace("/", "__")
    fell_back = snapshot(**{label: warm(count=5, fallback_rate=1.0)})  # primary failed over
    again = router.decide(conversation(), fell_back)
    assert again.primary.index == first.primary.index and again.trace.affinity == "hit"


def test_affinity_disabled_and_not_applicable() -> None:
    router = Router(config(GROUP.replace("affinity: {ttl_seconds: 600, max_entries: 100}",
                                         "affinity: {enabled: false}")), clock=ManualClock())
    assert router.decide(conversation()).trace.affinity == "disabled"
    router = Router(config(GROUP), clock=ManualClock())
    assert router.decide(request()).trace.affinity == "not_applicable"   # no conversation


def test_the_store_keeps_no_raw_text() -> None:
    canary = "CANARY-7c1e-do-not-retain"
    router = Router(config(GROUP), clock=ManualClock())
    for i in range(5):
        router.decide(conversation(f"{canary} {i}"))
    store = router.affinity_store("g")
    dump = pickle.dumps(store._pins)  # everything the store holds
    assert canary.encode() not in dump
    assert all(isinstance(key, bytes) and len(key) == 32 for key in store.digests())
