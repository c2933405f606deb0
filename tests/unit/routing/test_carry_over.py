"""A reload's carry-over in the routing core (docs/reload.md): a group whose configuration
did not change keeps all its state; a changed dynamic-score group keeps the pins to targets
that did not change and drops the others, without extending any TTL."""

from __future__ import annotations

from sidecar.routing.affinity import AffinityStore
from sidecar.routing.router import Router
from tests.clock import ManualClock
from tests.unit.routing.helpers import config

GROUPS = """
  steady:
    targets:
      - {provider: p, model_ref: a, weight: 1}
      - {provider: p, model_ref: b, weight: 3}
  sticky:
    strategy: dynamic_score
    targets:
      - {provider: p, model_ref: a}
      - {provider: p, model_ref: b}
      - {provider: q, model_ref: c}
"""



def test_an_unchanged_group_keeps_its_rotation_and_a_changed_one_its_valid_pins() -> None:
    clock = ManualClock(100.0)
    before = Router(config(GROUPS), clock=clock)
    pins = before.affinity_store("sticky")
    assert pins is not None
    pins.pin(b"to-a", 0)
    pins.pin(b"to-b", 1)
    pins.pin(b"to-c", 2)
    rotation_state = before._strategies["steady"]
    # c is removed, b changes (a new weight), a stays; the new order puts a second.
    changed = GROUPS.replace("""      - {provider: p, model_ref: a}
      - {provider: p, model_ref: b}
      - {provider: q, model_ref: c}""", """      - {provider: p, model_ref: b, weight: 5}
      - {provider: p, model_ref: a}""")
    after = Router(config(changed), clock=clock)
    after.carry_over(before)
    assert after._strategies["steady"] is rotation_state
    kept = after.affinity_store("sticky")
    assert kept is not None and kept.digests() == [b"to-a"]
    assert kept.lookup(b"to-a") == (1, False)  # a's new index
    clock.now += 3600  # the TTL ran from the original pin, not from the reload
    assert kept.lookup(b"to-a")[1] is True


def test_adopt_respects_the_new_bound() -> None:
    clock = ManualClock(100.0)
    old = AffinityStore(600, 10, clock)
    for n in range(5):
        old.pin(bytes([n]), n % 2)
    new = AffinityStore(600, 2, clock)
    new.adopt(old, {0: 0, 1: 1})
    assert new.digests() == [bytes([3]), bytes([4])]  # the most recent within the bound
