"""Configuration: the SPEC sample loads verbatim, and invalid configs say what and where."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from sidecar.config import ConfigError, load_config_file, load_config_text
from sidecar.config.policy import Complexity

FIXTURES = Path(__file__).parent.parent / "fixtures"
REPO = Path(__file__).parent.parent.parent
# The product spec lives beside the repository in the development workspace, not in it; a
# checkout on its own (CI, a fork) has only the fixture copied from it.
SPEC_MD = REPO.parent / "shared" / "SPEC.md"
SPEC_SAMPLE = FIXTURES / "spec_sample.yaml"


def test_spec_sample_loads_verbatim() -> None:
    """tests/fixtures/spec_sample.yaml is the SPEC's configuration sample byte for byte (no
    header, no edits: the next test holds it to that), loaded as it is, with nothing added,
    and it means what the SPEC says. Runs in every checkout, with or without the SPEC."""
    config = load_config_text(SPEC_SAMPLE.read_text())
    group = config.models["adaptive-agent"]
    assert group.strategy == "dynamic_score"
    assert [(t.provider, t.model_ref, t.weight) for t in group.targets] == [
        ("baseten", "gpt-oss-120b", 60), ("minimax", "m3", 25), ("openai", "gpt-5.4-nano", 5)]
    policy = group.dynamic_score
    assert policy.min_observations == 20
    assert policy.max_score_adjustment_percent == 70
    assert policy.affinity.enabled is True and policy.affinity.ttl_seconds == 600
    assert policy.affinity.max_entries == 10_000
    assert policy.signals.prompt_features.max_scan_bytes == 16384
    assert policy.score_terms[0].when.complexity_lte is Complexity.STANDARD
    assert policy.score_terms[1].require_tags == ["validated"]
    assert policy.thresholds.max_p95_latency_ms == 10000
    # The catalog supplies the providers the sample names without declaring them.
    assert config.providers["baseten"].base_url == "https://inference.baseten.co/v1"
    assert config.providers["minimax"].credential.env == "MINIMAX_API_KEY"


@pytest.mark.skipif(not SPEC_MD.is_file(),
                    reason="../shared/SPEC.md is not beside this checkout: the fixture cannot be "
                           "compared with it (test_spec_sample_loads_verbatim still ran)")
def test_fixture_is_still_the_sample_in_spec_md() -> None:
    """The SPEC has one YAML block, its configuration sample; the fixture is that block's
    text byte for byte, from the line after the opening fence to the closing fence."""
    blocks = re.findall(rb"^```yaml\n(.*?)^```", SPEC_MD.read_bytes(), re.S | re.M)
    assert len(blocks) == 1, "SPEC.md has more than one YAML block: which is the sample?"
    assert SPEC_SAMPLE.read_bytes() == blocks[0], (
        "tests/fixtures/spec_sample.yaml differs from the SPEC's sample: copy the block again")


def test_config_example_contains_the_spec_group_verbatim() -> None:
    sample = SPEC_SAMPLE.read_text()
    example = (REPO / "config.example.yaml").read_text()
    assert sample[len("models:\n"):] in example
    load_config_file(REPO / "config.example.yaml")


def test_policy_defaults_apply_when_the_block_is_absent() -> None:
    config = load_config_text("models: {g: {strategy: dynamic_score, targets: "
                              "[{provider: openai, model_ref: m}]}}")
    policy = config.models["g"].dynamic_score
    assert policy.affinity.enabled and policy.affinity.ttl_seconds == 600
    assert policy.hard_filters.require_reasoning_support_when_requested is False


def test_provider_entry_overrides_catalog_keys_and_keeps_the_rest() -> None:
    config = load_config_text(textwrap.dedent("""
        providers:
          minimax: {base_url: "http://127.0.0.1:9/v1"}
        models: {g: {targets: [{provider: minimax, model_ref: m, api: anthropic_messages}]}}
    """))
    minimax = config.providers["minimax"]
    assert minimax.base_url == "http://127.0.0.1:9/v1"
    assert minimax.credential.env == "MINIMAX_API_KEY"
    assert "anthropic_messages" in minimax.dialects
    # The catalog's per-dialect URLs belonged to the catalog's host, so they are dropped.
    assert minimax.dialect_base_urls == {}


GOOD_TARGET = "{provider: openai, model_ref: m}"

INVALID = [
    ("models: {g: {strategy: dynamic_score, targets: [%s], routing_policy: {dynamic_score: "
     "{max_score_adjustment_percent: 150}}}}" % GOOD_TARGET,
     "models.g.routing_policy.dynamic_score.max_score_adjustment_percent: "
     "must be between 0 and 100"),
    ("models: {g: {targets: [{provider: openai, model_ref: m, weight: -1}]}}",
     "models.g.targets[0].weight: must be at least 0"),
    ("models: {g: {targets: [{provider: nobody, model_ref: m}]}}",
     "models.g.targets[0].provider: unknown provider 'nobody'"),
    ("models: {g: {targets: [{provider: openai, model_ref: m, tagz: [a]}]}}",
     "models.g.targets[0].tagz: unknown key; did you mean 'tags'?"),
    ("models: {g: {strategy: round_robin, targets: [%s]}}" % GOOD_TARGET,
     "models.g.strategy: must be 'weighted', 'failover', 'dynamic_score', 'script' or 'external'"),
    ("models: {g: {targets: []}}", "models.g.targets: "),
    ("models: {g: {targets: [{provider: openai}]}}", "models.g.targets[0].model_ref: is required"),
    ("models: {g: {strategy: dynamic_score, targets: [%s], routing_policy: {dynamic_score: "
     "{score_terms: [{name: t, expression: '0.5 * speed_score'}]}}}}" % GOOD_TARGET,
     "models.g.routing_policy.dynamic_score.score_terms[0].expression: unknown name "
     "'speed_score' at column 7"),
    ("models: {g: {strategy: dynamic_score, targets: [%s], routing_policy: {dynamic_score: "
     "{score_terms: [{name: t, expression: '__import__(\"os\")'}]}}}}" % GOOD_TARGET,
     "score_terms[0].expression: unexpected character"),
    ("models: {g: {strategy: dynamic_score, targets: [%s], routing_policy: {dynamic_score: "
     "{thresholds: {max_error_rate: 3}}}}}" % GOOD_TARGET,
     "models.g.routing_policy.dynamic_score.thresholds.max_error_rate: "
     "must be between 0 and 1"),
    ("models: {g: {strategy: dynamic_score, targets: [%s], routing_policy: {dynamic_score: "
     "{affinity: {ttl_seconds: 0}}}}}" % GOOD_TARGET,
     "models.g.routing_policy.dynamic_score.affinity.ttl_seconds: must be greater than 0"),
    ("models: {g: {strategy: dynamic_score, targets: [%s], routing_policy: {dynamic_score: "
     "{score_terms: [{name: t, when: {complexity_gte: huge}, expression: '1'}]}}}}"
     % GOOD_TARGET,
     "score_terms[0].when.complexity_gte: must be 'simple', 'standard' or 'complex'"),
    ("models: {g: {targets: [%s]}}\ncallers: [{name: a, models: [g]}]" % GOOD_TARGET,
     "callers[0]: set exactly one of 'token_sha256', 'token_env' or 'token_file'"),
    ("models: {g: {targets: [%s]}}\ncallers: [{name: a, token_sha256: abc}]" % GOOD_TARGET,
     "callers[0].token_sha256: must be 64 hexadecimal characters"),
    ("models: {g: {targets: [%s]}}\ncallers: [{name: a, token_env: T, models: [h]}]"
     % GOOD_TARGET,
     "callers[0].models: unknown model group 'h'"),
    ("providers: {local: {base_url: 'ftp://x'}}\nmodels: {g: {targets: [%s]}}" % GOOD_TARGET,
     "providers.local.base_url: must be an http:// or https:// URL with a host"),
    ("providers: {local: {base_url: 'http://x', credential: {env: A, file: /b}}}\n"
     "models: {g: {targets: [%s]}}" % GOOD_TARGET,
     "providers.local.credential: set exactly one of 'env' or 'file'"),
    ("models: {g: {targets: [{provider: baseten, model_ref: m, api: anthropic_messages}]}}",
     "models.g.targets[0].api: provider 'baseten' does not speak 'anthropic_messages'"),
    ("models: {g: {targets: [{provider: openai, model_ref: m, weight: 0}]}}",
     "models.g.targets: at least one target needs a weight above 0"),
    ("providers: {p: {base_url: 'https://a.example/v1', dialects: [openai_chat, "
     "anthropic_messages], dialect_base_urls: {anthropic_messages: 'https://b.example/v1'}}}\n"
     "models: {g: {targets: [%s]}}" % GOOD_TARGET,
     "providers.p: dialect_base_urls.anthropic_messages must share the scheme, host and port"),
    ("models: {'bad group': {targets: [%s]}}" % GOOD_TARGET,
     "models.bad group: a group name must start with a letter or digit"),
    ('models: {"g\\n": {targets: [%s]}}' % GOOD_TARGET, "a group name must start with"),
    ("models: [1, 2]", "models: must be a valid dictionary"),
    ("models: {'a.b': {targets: [%s]}, 'a_b': {targets: [%s]}}" % (GOOD_TARGET, GOOD_TARGET),
     "models.a_b: group names 'a.b' and 'a_b' differ only in characters"),
    ("models: {g: {targets: [%s]}}\nlimits: {request_timeout_seconds: .inf}" % GOOD_TARGET,
     "limits.request_timeout_seconds: must be a finite number greater than 0"),
    ("models: {g: {targets: [%s]}}\nlimits: {sidecar_message_timeout_ms: 600000}"
     % GOOD_TARGET, "limits.sidecar_message_timeout_ms: must be between 1 and 60000"),
    ("models: {g: {targets: [{provider: openai, model_ref: m, "
     "pricing: {input_per_mtok: .nan, output_per_mtok: 1}}]}}",
     "models.g.targets[0].pricing.input_per_mtok: must be a finite number"),
    ("routes: {}", "models: is required"),
    ("models: {g: {targets: [%s]}}\nroutes: {}" % GOOD_TARGET,
     "routes: unknown key (allowed: callers, fleet, limits, models, observations, providers, "
     "quotas, sessions, telemetry)"),
    ("models: {g: {targets: [%s], response_cache: {fleet: true}}}" % GOOD_TARGET,
     "models.g.response_cache.fleet needs a fleet Redis"),
    ("models: {g: [", "not valid YAML at line"),
]


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_invalid_config_reports_path_and_message(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(text)
    rendered = [str(problem) for problem in caught.value.problems]
    assert any(expected in line for line in rendered), rendered


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text("models: {g: {strategy: x, targets: [{provider: openai, weight: -2}]}}")
    paths = sorted(problem.path for problem in caught.value.problems)
    assert paths == ["models.g.strategy", "models.g.targets[0].model_ref",
                     "models.g.targets[0].weight"]


def test_string_values_are_never_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text("models: {g: {targets: [%s]}}\ncallers: [{name: a, "
                         "token_sha256: sk-live-secret-value}]" % GOOD_TARGET)
    assert "sk-live-secret-value" not in str(caught.value)


def test_names_with_a_trailing_newline_are_refused() -> None:
    """Header names end up inside generated Lua and Envoy config; `$` alone would let a
    final newline through (review finding)."""
    for bad in ('pass_response_headers: ["x-resp\\n"]', 'pass_request_headers: ["a\\nb"]',
                'credential: {env: "KEY\\n"}'):
        with pytest.raises(ConfigError):
            load_config_text(f"providers: {{p: {{base_url: 'http://127.0.0.1:9/v1', {bad}}}}}\n"
                             "models: {g: {targets: [{provider: p, model_ref: m}]}}\n")


def test_a_first_token_timeout_needs_the_first_event_commit_and_fits_the_deadline() -> None:
    from sidecar.config.models import Fallback
    with pytest.raises(ValueError, match="needs commit_at_first_event: true"):
        Fallback(commit_at_first_event=False, first_token_timeout_seconds=2)
    assert Fallback(first_token_timeout_seconds=2).first_event_wait_seconds == 2  # default on
    with pytest.raises(ValueError, match="must not exceed deadline_seconds"):
        Fallback(commit_at_first_event=True, first_token_timeout_seconds=20,
                 per_try_timeout_seconds=5, deadline_seconds=10)
    fallback = Fallback(commit_at_first_event=True, per_try_timeout_seconds=7)
    assert fallback.first_event_wait_seconds == 7


def test_only_a_regular_file_of_bounded_size_is_read(tmp_path) -> None:
    """Issue #28: a FIFO blocked every reload until it got EOF; no size cap."""
    import os
    import time

    from sidecar.config.loading import MAX_CONFIG_BYTES, ConfigError, load_config_file

    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config_file(fifo)
    assert time.monotonic() - started < 1
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config_file(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match="larger than 16 MiB"):
        load_config_file(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"models: {g: {targets: [{provider: openai, model_ref: caf\xe9}]}}")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config_file(latin)
    with pytest.raises(ConfigError, match="No such file"):
        load_config_file(tmp_path / "missing.yaml")


def test_yaml_nested_to_death_is_a_problem_with_the_parsers_words() -> None:
    from sidecar.config.loading import ConfigError, load_config_text

    with pytest.raises(ConfigError, match="exceeded maximum nesting depth"):
        load_config_text("models: " + "[" * 20000 + "]" * 20000)
    with pytest.raises(ConfigError, match="line 5, column 1: did not find expected ',' or ']'"):
        load_config_text("models:\n  a:\n    targets: [\n  b: 1\n")


def test_a_file_of_too_many_values_is_refused_before_it_is_built() -> None:
    """At the size cap, a file of small values took 40 s to load; now it is counted first."""
    import time

    from sidecar.config.loading import MAX_CONFIG_EVENTS, ConfigError, load_config_text

    text = "models: [" + "1, " * (MAX_CONFIG_EVENTS + 10) + "1]\n"
    started = time.monotonic()
    with pytest.raises(ConfigError, match="more than 250,000 YAML values"):
        load_config_text(text)
    assert time.monotonic() - started < 20  # under 0.5 s; a machine 4x slower still passes


def test_aliases_that_expand_past_the_budget_are_refused() -> None:
    """A 106 KB file of aliases to aliases (1,000 groups of the same 1,000 targets of the
    same 10,000 tags) grew to 2 GB in 15 s under validation and never ended."""
    from sidecar.config.loading import ConfigError, load_config_text

    tags = ", ".join(f"t{i}" for i in range(10_000))
    lines = ["providers: {p: {base_url: 'http://127.0.0.1:9/v1', credential: null}}",
             f"x-tags: &tags [{tags}]",
             "x-target: &target {provider: p, model_ref: m, tags: *tags}",
             "x-targets: &targets [" + ", ".join(["*target"] * 1000) + "]", "models:",
             *(f"  g{i}: {{targets: *targets}}" for i in range(1000))]
    with pytest.raises(ConfigError, match="once its aliases are expanded"):
        load_config_text("\n".join(lines) + "\n")


def test_aliases_within_the_budget_still_work() -> None:
    config = load_config_text(
        "providers: {p: {base_url: 'http://127.0.0.1:9/v1', credential: null}}\n"
        "models: {a: {targets: [&target {provider: p, model_ref: m}]}, "
        "b: {targets: [*target]}}\n")
    assert set(config.models) == {"a", "b"}



def problem_lines(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config_text(textwrap.dedent(text))
    return [str(problem) for problem in caught.value.problems]


def test_a_problem_in_one_place_hides_none_elsewhere() -> None:
    """Issue #29.5: a field error anywhere hid every cross-reference problem (unknown groups
    and providers), a bad script rule hid another rule's unknown target (whose message split
    its path: `models.bad: script.rules[0]: ...`), and a bad group name hid everything."""
    lines = problem_lines("""
        providers: {local: {base_url: "http://127.0.0.1:9/v1"}}
        callers:
          - {name: a, token_env: T, models: [nope]}
          - {name: b, token_sha256: abc, models: [gone]}
        models:
          bad:
            strategy: script
            targets: [{provider: local, model_ref: m}]
            script:
              rules:
                - {order: [local/zzz]}
                - {when: "((", order: [local/m]}
                - {require: {targets: [local/m, local/yyy]}, exclude: {targets: [local/xxx]}}
          g:
            targets: [{provider: local, model_ref: m, weight: -1}, {provider: nobody, model_ref: n}]
          'bad name': {targets: [{provider: local, model_ref: m}]}
    """)
    paths = sorted(line.split(": ", 1)[0] for line in lines)
    assert paths == sorted([
        "models.bad.script.rules[1].when", "models.g.targets[0].weight", "models.bad name",
        "callers[1].token_sha256", "models.bad.script.rules[0].order",
        "models.bad.script.rules[2].require.targets", "models.bad.script.rules[2].exclude.targets",
        "models.g.targets[1].provider", "callers[0].models", "callers[1].models"]), lines
    assert ("models.bad.script.rules[0].order: no target 'local/zzz' in this group "
            "(targets: local/m)") in lines
    assert ("models.bad.script.rules[2].require.targets: no target 'local/yyy' in this group "
            "(targets: local/m)") in lines
    assert "callers[1].models: unknown model group 'gone'" in lines  # an invalid caller's
    assert any(line.startswith("models.g.targets[1].provider: unknown provider 'nobody'")
               for line in lines)


def test_a_check_is_skipped_only_where_what_it_reads_is_invalid() -> None:
    """No noise from a part that failed: a target of an invalid provider is not told its
    provider is unknown, an invalid target still lends its label to the script rules, an
    unusable `models:` makes no caller's group unknown."""
    lines = problem_lines("""
        providers: {p: {base_url: 'ftp://x'}}
        models:
          g: {targets: [{provider: p, model_ref: m, api: anthropic_messages}]}
          h:
            strategy: script
            targets: [{provider: openai, model_ref: m, weight: x}]
            script: {rules: [{order: [openai/m]}]}
    """)
    assert [line.split(": ", 1)[0] for line in lines] == [
        "providers.p.base_url", "models.h.targets[0].weight"], lines
    lines = problem_lines("""
        callers: [{name: a, token_env: T, models: [g]}]
        models: [1, 2]
    """)
    assert lines == ["models: must be a valid dictionary"], lines


def test_a_strategy_without_its_block_is_reported_beside_a_field_error() -> None:
    lines = problem_lines("""
        models:
          g: {strategy: script, targets: [{provider: openai, model_ref: m, weight: -1}]}
    """)
    assert "models.g.script: strategy: script needs a 'script' block with rules" in lines
    assert "models.g.targets[0].weight: must be at least 0 (got -1)" in lines


def test_a_yaml_syntax_error_has_the_parsers_reason_and_where_it_stopped() -> None:
    """Issue #29.5: a bad indent gave `not valid YAML at line 8, column 6` and no place."""
    lines = problem_lines("""
        providers:
          local: {base_url: "http://127.0.0.1:9/v1"}
        models:
          g:
            targets:
              - provider: local
                model_ref: m
             weight: 2
    """)
    assert lines == ["models.g: not valid YAML at line 9, column 6: did not find expected "
                     "key (in the block mapping that starts at line 6, column 5)"]
    assert problem_lines("models: {g: {targets: [{provider: p, model_ref: [}]}}")[0].startswith(
        "models.g.targets[0].model_ref: not valid YAML at line 1")


def test_check_config_file_with_secrets_lists_every_layer_at_once(tmp_path: Path) -> None:
    """`check-config --secrets` gave the field errors, then (once fixed) the caller tokens,
    then (once fixed) the provider keys."""
    from sidecar.config.checks import check_config_file

    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(f"""
        providers: {{local: {{base_url: "http://127.0.0.1:9/v1", credential: {{env: NO_KEY}}}}}}
        callers:
          - {{name: a, token_env: NO_TOKEN}}
          - {{name: b, token_file: {tmp_path / "missing"}}}
          - {{name: c, token_sha256: {"a" * 64}}}
          - {{name: d, token_sha256: {"a" * 64}}}
        models:
          g: {{targets: [{{provider: local, model_ref: m}}]}}
          h: {{targets: [{{provider: local, model_ref: m, weight: -1}}]}}
    """))
    checked = check_config_file(path, {}, caller_tokens=True, provider_keys=True)
    assert checked.config is None
    lines = [str(problem) for problem in checked.problems]
    assert lines == [
        "models.h.targets[0].weight: must be at least 0 (got -1)",
        "callers[0].token_env: environment variable NO_TOKEN is not set or empty (caller 'a')",
        f"callers[1].token_file: cannot read secret file {tmp_path / 'missing'}: No such file "
        "or directory (caller 'b')",
        "callers[3].token_sha256: caller 'd' has the same token as 'c' (callers[2])",
        "providers.local.credential.env: environment variable NO_KEY is not set or empty"]
    assert check_config_file(path, {}).problems == checked.problems[:1]  # no secrets asked
