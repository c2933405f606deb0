"""The response-header allowlist as one RE2 expression (envoy_config/response_headers.py):
it must accept exactly the names Envoy is to remove. Python's `re` agrees with RE2 on the
constructs it uses (classes, groups, alternation, `?`, `.*`), and the e2e trust-boundary
test runs the same expression in the real Envoy."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from sidecar.config import load_config_text
from sidecar.envoy_config.response_headers import complement_regex, response_header_filter
from sidecar.header_policy import RESPONSE_ALLOWLIST

# The characters the config models allow in a header name, plus ':' (pseudo-headers).
NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+.^_`|~-"
names = st.text(alphabet=NAME_CHARS, min_size=1, max_size=12)
probes = st.text(alphabet=NAME_CHARS + ":", min_size=1, max_size=14)


@given(allowed=st.frozensets(names, min_size=1, max_size=25), probe=probes)
def test_the_regex_matches_exactly_the_names_to_remove(allowed: frozenset[str],
                                                       probe: str) -> None:
    pattern = re.compile(complement_regex(allowed))
    assert bool(pattern.fullmatch(probe)) == (probe not in allowed and probe[0] != ":")
    for name in allowed:
        assert not pattern.fullmatch(name)
        # One character more or less than an allowed name is another name.
        assert pattern.fullmatch(name + "x") or name + "x" in allowed
        assert len(name) == 1 or pattern.fullmatch(name[:-1]) or name[:-1] in allowed


def test_the_default_allowlist_keeps_its_names_and_drops_the_rest() -> None:
    pattern = re.compile(complement_regex(RESPONSE_ALLOWLIST))
    for kept in (*RESPONSE_ALLOWLIST, ":status"):
        assert not pattern.fullmatch(kept), kept
    for dropped in ("set-cookie", "openai-organization", "x-ratelimit-remaining-requests",
                    "content", "content-types", "x-request", "server-timing", "retry-after-ms"):
        assert pattern.fullmatch(dropped), dropped


def test_a_providers_extra_names_are_kept() -> None:
    config = load_config_text("""
providers:
  p: {base_url: 'http://127.0.0.1:9/v1', pass_response_headers: [x-ratelimit-remaining-requests]}
models:
  g: {targets: [{provider: p, model_ref: m}]}
""")
    rule, = response_header_filter(config).typed_config.unpack().mutations.response_mutations
    pattern = re.compile(rule.remove_on_match.key_matcher.safe_regex.regex)
    assert not pattern.fullmatch("x-ratelimit-remaining-requests")
    assert pattern.fullmatch("x-ratelimit-remaining-tokens")
