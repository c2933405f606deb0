"""`sidecar explain`: the offline view of one decision, as an operator runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
SPEC = Path(__file__).parent.parent / "fixtures" / "spec_sample.yaml"


def explain(tmp_path: Path, body: dict, *extra: str) -> subprocess.CompletedProcess[str]:
    request = tmp_path / "request.json"
    request.write_text(json.dumps(body))
    return subprocess.run([sys.executable, "-m", "sidecar", "explain", "--config", str(SPEC),
                           "--request", str(request), *extra],
                          capture_output=True, text=True, timeout=60)


def test_explain_table_shows_winner_losers_and_scores(tmp_path: Path) -> None:
    observations = tmp_path / "obs.json"
    observations.write_text(json.dumps({"targets": {
        "baseten/gpt-oss-120b": {"count": 50, "p95_latency_ms": 900},
        "minimax/m3": {"count": 50, "p95_latency_ms": 300},
        "openai/gpt-5.4-nano": {"count": 50, "error_rate": 0.2}}}))
    result = explain(tmp_path, {"model": "adaptive-agent",
                                "messages": [{"role": "user", "content": "hi"}]},
                     "--observations", str(observations))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "strategy: dynamic_score" in out
    assert "score_terms: cheapest_fast_enough" in out
    assert "excluded: openai/gpt-5.4-nano  by thresholds.max_error_rate" in out
    header = next(line for line in out.splitlines() if line.startswith("target"))
    assert header.split() == ["target", "warm", "obs", "cost", "latency", "throughput",
                              "reliability", "complexity", "eval_quality", "term", "weight",
                              "final"]
    minimax = next(line for line in out.splitlines() if line.startswith("minimax/m3"))
    assert minimax.split()[4] == "1.000"  # fastest p95 → latency_score 1
    # The blend step itself: the SPEC sample's 70 % room, split by softmax at sharpness 8.
    assert ("blend: final = 0.30 × weight share + 0.70 × warm weight × softmax(8 × term) "
            "over the warm targets (cold: weight share)") in out


def test_explain_json_for_a_refusal(tmp_path: Path) -> None:
    body = {"model": "adaptive-agent", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}]}]}
    result = explain(tmp_path, body, "--format", "json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert "image input needs a target that accepts images" in document["refused"]
    stages = {e["stage"] for e in document["trace"]["exclusions"]}
    assert stages == {"hard_filters.require_input_modalities"}


def test_explain_reports_bad_inputs_clearly(tmp_path: Path) -> None:
    result = explain(tmp_path, {"model": "nope"})
    assert result.returncode == 2 and "unknown model group 'nope'" in result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"targets": {"x": {"count": 1, "speed": 3}}}')
    result = explain(tmp_path, {"model": "adaptive-agent", "messages": []},
                     "--observations", str(bad))
    assert result.returncode == 2 and "unknown figure(s) ['speed']" in result.stderr


def test_explain_rejects_out_of_range_figures_and_deep_requests(tmp_path: Path) -> None:
    for figures, message in (({"count": 1e400}, "must be a finite number"),
                             ({"count": 5, "error_rate": -5}, "must not be negative"),
                             ({"count": 5, "timeout_rate": 2}, "between 0 and 1"),
                             ({"count": 2.5}, "whole number")):
        bad = tmp_path / "obs.json"
        bad.write_text(json.dumps({"targets": {"p/m": figures}}).replace("Infinity", "1e400"))
        result = explain(tmp_path, {"model": "adaptive-agent", "messages": []},
                         "--observations", str(bad))
        assert result.returncode == 2, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
    deep = tmp_path / "deep.json"
    deep.write_text('{"model": "adaptive-agent", "x": ' + "[" * 50_000 + "]" * 50_000 + "}")
    result = subprocess.run([sys.executable, "-m", "sidecar", "explain", "--config", str(SPEC),
                             "--request", str(deep)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "nested too deeply" in result.stderr


def test_explain_keys_the_conversation_and_shows_the_affinity_outcome(tmp_path: Path) -> None:
    """Issue #29.11: explain reported affinity as not applicable for every request."""
    body = {"model": "adaptive-agent", "messages": [{"role": "user", "content": "Fix my bug"}]}
    result = explain(tmp_path, body)
    assert result.returncode == 0, result.stderr
    primary = next(line.split()[1] for line in result.stdout.splitlines()
                   if line.startswith("primary:"))
    assert (f"affinity: miss_created (a new conversation: pinned to {primary} from this turn "
            "on)") in result.stdout
    document = json.loads(explain(tmp_path, body, "--format", "json").stdout)
    assert document["trace"]["affinity"] == "miss_created"
    # No opening to key (a Responses follow-up threads state upstream): not applicable.
    follow_up = explain(tmp_path, {"model": "adaptive-agent", "input": "more",
                                   "previous_response_id": "resp_1"},
                        "--api", "openai_responses", "--format", "json")
    assert json.loads(follow_up.stdout)["trace"]["affinity"] == "not_applicable"


def test_explain_names_the_evaluation_behind_eval_quality(tmp_path: Path) -> None:
    """Issue 42: `validation.suite` and `validated_at` were parsed and read by nothing; an
    operator trusting eval_quality_score could not see which evaluation it came from."""
    import yaml

    config = yaml.safe_load(SPEC.read_text())
    targets = config["models"]["adaptive-agent"]["targets"]
    targets[0]["evaluation"] = {"quality_score": 0.9}
    targets[0]["validation"] = {"status": "passed", "pass_rate": 0.8,
                                "suite": "coding-regression-v3", "validated_at": "2026-11-30"}
    edited = tmp_path / "config.yaml"
    edited.write_text(yaml.safe_dump(config))
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": "adaptive-agent",
                                   "messages": [{"role": "user", "content": "hi"}]}))
    command = [sys.executable, "-m", "sidecar", "explain", "--config", str(edited),
               "--request", str(request)]
    table = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    assert ("  baseten/gpt-oss-120b: eval_quality_score 0.850 from evaluation: quality_score "
            "0.9; validation: status passed, pass_rate 0.8, suite coding-regression-v3, "
            "validated_at 2026-11-30") in table.stdout.splitlines()
    assert ("  minimax/m3: eval_quality_score 0.500 from nothing configured (neutral)"
            in table.stdout.splitlines())
    # A failed validation scores 0, whatever the evaluation says.
    targets[1]["validation"] = {"status": "failed", "suite": "smoke"}
    edited.write_text(yaml.safe_dump(config))
    failed = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    assert ("  minimax/m3: eval_quality_score 0.000 from validation: status failed, suite smoke"
            in failed.splitlines())
    document = json.loads(subprocess.run([*command, "--format", "json"], capture_output=True,
                                         text=True, timeout=60).stdout)
    entry = document["evaluation_metadata"]["baseten/gpt-oss-120b"]
    assert entry["validation"] == {"status": "passed", "pass_rate": 0.8,
                                   "suite": "coding-regression-v3",
                                   "validated_at": "2026-11-30"}
    assert entry["eval_quality_score"] == pytest.approx(0.85)
