"""The SPEC's rollout list as requests and expectations (sidecar/rollout/checklist.py), and
how a turn is judged and reported (check_run.judge, check_report): pure, no gateway."""

from __future__ import annotations

import json
from pathlib import Path

from sidecar.config import load_config_file
from sidecar.rollout.check_report import as_json, as_table, exit_code
from sidecar.rollout.check_run import Seen, Verdict, judge, new_traceparent, should_text
from sidecar.rollout.checklist import checklist
from sidecar.telemetry.rows import origin, valid_traceparent
from tests.unit.routing.helpers import config

SPEC = load_config_file(Path(__file__).parents[2] / "fixtures" / "spec_sample.yaml")
SPEC_ORDER = ["simple_text", "code_debug", "multi_turn_affinity", "ttl_expiry",
              "caller_isolation", "tools", "forced_tool", "images", "structured_output",
              "reasoning", "streaming_cancellation", "low_max_tokens"]
BASETEN, MINIMAX, NANO = "baseten/gpt-oss-120b", "minimax/m3", "openai/gpt-5.4-nano"


def items(conf=SPEC, group="adaptive-agent", **flags):  # type: ignore[no-untyped-def]
    chosen = {"second_caller": False, "wait_ttl": False} | flags
    return {item.name: item for item in checklist(conf, group, "check 1", **chosen)}


def test_every_kind_the_spec_names_is_an_item_in_the_spec_order() -> None:
    assert list(items()) == SPEC_ORDER


def test_what_should_happen_comes_from_the_router_on_the_spec_sample() -> None:
    found = items()
    simple = found["simple_text"].turns[0].expect
    assert (simple.allowed, simple.complexity) == (frozenset({BASETEN, MINIMAX, NANO}), "simple")
    debug = found["code_debug"].turns[0].expect
    # complex_quality_floor requires the validated tag: the fallback target may not serve.
    assert (debug.allowed, debug.complexity) == (frozenset({BASETEN, MINIMAX}), "complex")
    for name in ("tools", "forced_tool"):
        assert found[name].turns[0].expect.allowed == {BASETEN, MINIMAX}
    assert found["forced_tool"].turns[0].body["tool_choice"] == "required"
    assert found["low_max_tokens"].turns[0].expect.allowed == {BASETEN, MINIMAX, NANO}
    # Kinds the sample's targets do not declare are refused, in the caller's words.
    refusals = {name: found[name].turns[0].expect.refusal
                for name in ("images", "structured_output", "reasoning")}
    assert "image input needs a target that accepts images" in refusals["images"]
    assert "structured output" in refusals["structured_output"]
    assert "reasoning/thinking needs a target with reasoning support" in refusals["reasoning"]
    assert all(found[name].turns[0].expect.refused for name in refusals)


def test_affinity_items_pin_then_hit_and_say_why_they_need_more() -> None:
    found = items()
    first, second = found["multi_turn_affinity"].turns
    assert first.expect.affinity == "miss_created"
    assert (second.expect.affinity, second.expect.same_target_as) == ("hit", 0)
    assert second.body["messages"][0] == first.body["messages"][0]
    assert "--wait-ttl" in found["ttl_expiry"].skipped and "601 s" in found["ttl_expiry"].skipped
    assert "second caller" in found["caller_isolation"].skipped
    ready = items(second_caller=True, wait_ttl=True)
    # A hit half a TTL in does not extend the pin: half a TTL and a second later it expired.
    first_turn, hit, later = ready["ttl_expiry"].turns
    assert (first_turn.wait_s, hit.wait_s, later.wait_s) == (0.0, 300.0, 301.0)
    assert (hit.expect.affinity, hit.expect.same_target_as) == ("hit", 0)
    assert later.expect.affinity == "expired_replaced"
    mine, theirs = ready["caller_isolation"].turns
    assert theirs.second_caller and not mine.second_caller
    assert mine.body == theirs.body and theirs.expect.affinity == "miss_created"


def test_a_group_that_pins_nothing_says_so_instead_of_checking_ttl_or_isolation() -> None:
    weighted = config("""
  w:
    strategy: weighted
    targets:
      - {provider: p, model_ref: a, weight: 1}
""")
    found = items(weighted, "w", second_caller=True, wait_ttl=True)
    assert "pins no conversation" in found["ttl_expiry"].skipped
    assert "pins no conversation" in found["caller_isolation"].skipped
    first, second = found["multi_turn_affinity"].turns
    assert first.expect.affinity == second.expect.affinity == "not_applicable"
    assert second.expect.same_target_as is None


def test_each_run_opens_new_conversations() -> None:
    one = checklist(SPEC, "adaptive-agent", "check a", second_caller=False, wait_ttl=False)
    two = checklist(SPEC, "adaptive-agent", "check b", second_caller=False, wait_ttl=False)
    assert one[0].turns[0].body != two[0].turns[0].body


def row(target: str, **columns):  # type: ignore[no-untyped-def]
    """A joined row as the admin endpoint returns it."""
    return {"selected_target": target, "serving_target": target, "status": 200,
            "join_kind": "joined", "complexity": "simple", "affinity": "miss_created",
            "error_class": "ok", "output_tokens": 5} | columns


def test_a_turn_is_judged_on_the_row_the_gateway_wrote() -> None:
    found = items()
    simple = found["simple_text"].turns[0]
    served = row(MINIMAX)
    assert judge(simple, Seen(200), served, [served])
    assert not judge(simple, Seen(200), row(MINIMAX, complexity="complex"), [])
    assert not judge(simple, Seen(502, "upstream"), served, [served])
    assert not judge(simple, Seen(200), None, [None])
    # A row without its outcome, or whose outcome failed, is not a pass.
    assert not judge(simple, Seen(200), row(MINIMAX, join_kind="decision_only"), [])
    assert not judge(simple, Seen(200), row(MINIMAX, serving_target=None), [])
    assert not judge(simple, Seen(200), row(MINIMAX, status=503), [])
    debug = found["code_debug"].turns[0]
    assert not judge(debug, Seen(200), row(NANO, complexity="complex"), [])


def test_affinity_is_judged_on_the_selected_target_not_on_who_served_after_a_fallback(
) -> None:
    first, second = items()["multi_turn_affinity"].turns
    # Turn 1 selected baseten, which failed over to minimax: the pin holds baseten.
    pinned = row(MINIMAX, selected_target=BASETEN)
    assert judge(first, Seen(200), pinned, [pinned])
    hit = row(BASETEN, affinity="hit")
    assert judge(second, Seen(200), hit, [pinned, hit])
    moved = row(MINIMAX, affinity="hit")
    assert not judge(second, Seen(200), moved, [pinned, moved])


def test_refusals_caps_and_cancellations_are_judged_as_such() -> None:
    found = items()
    images = found["images"].turns[0]
    assert judge(images, Seen(400, images.expect.refusal), None, [None])
    assert not judge(images, Seen(400, "something else"), None, [None])
    assert not judge(images, Seen(200), row(BASETEN), [])
    capped = found["low_max_tokens"].turns[0]
    assert judge(capped, Seen(200), row(NANO, output_tokens=16), [])
    assert not judge(capped, Seen(200), row(NANO, output_tokens=17), [])
    cancel = found["streaming_cancellation"].turns[0]
    cancelled = row(BASETEN, error_class="client_cancel")
    assert cancel.cancel and judge(cancel, Seen(200, events=1), cancelled, [cancelled])
    # Answered in full before the close: this turn could not test a cancellation.
    assert judge(cancel, Seen(200, events=1), row(BASETEN), []) is None
    assert judge(cancel, Seen(200, events=1), row(BASETEN, error_class="reset"), []) is False


def test_the_report_says_what_should_and_did_happen_and_exits_for_ci() -> None:
    found = items()
    should = should_text(found["code_debug"].turns[0].expect)
    assert should == f"served by {BASETEN} or {MINIMAX}, complexity complex"
    capped = should_text(found["low_max_tokens"].turns[0].expect)
    assert capped.endswith("at most 16 output tokens")
    verdicts = [Verdict("simple_text", 1, "served by x", "200 by x", True),
                Verdict("ttl_expiry", 0, "TTL expiry", "needs 600 s", None)]
    assert exit_code(verdicts) == 0
    failing = [*verdicts, Verdict("images", 1, "refused (400): no", "200 by x", False)]
    assert exit_code(failing) == 1
    table = as_table("g", failing)
    assert table.splitlines()[0] == "rollout check of group g: 1 passed, 1 failed, 1 not run"
    assert any(line.startswith("✘  images") for line in table.splitlines())
    document = json.loads(as_json("g", failing))
    assert (document["passed"], document["failed"], document["skipped"]) == (1, 1, 1)
    assert [r["result"] for r in document["rows"]] == ["pass", "skipped", "fail"]


def test_checklist_requests_are_marked_by_their_trace_id_and_nothing_else_is() -> None:
    traceparent, trace_id = new_traceparent()
    assert valid_traceparent(traceparent) and trace_id in traceparent
    assert origin(traceparent) == "rollout_check"
    assert origin("00-" + "ab" * 16 + "-" + "cd" * 8 + "-01") is None
    assert origin("00-c4ec1157-not-a-traceparent") is None
    assert new_traceparent()[1] != trace_id
