"""Request eligibility, shared by every strategy, and the dynamic-score hard filters.

Each rule is a small function named after what it enforces; it returns True when the target
may serve the request. As the SPEC has it, image and reasoning requests need matching
*declared* metadata (unknown is not enough), while a tool request needs compatible tool
passthrough, which only a declared `supports_tools: false` rules out; structured output
(JSON mode, JSON schema) needs declared `supports_structured_output`. The hard filters are
the policy-declared versions; `require_tool_support_when_tools_present` is the one that is
stricter than its baseline (it wants tool support declared). When a dynamic-score group
enables a hard filter, its exclusions are reported under the filter's config key; otherwise
the baseline rule applies and is reported as `eligibility.<rule>`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.models import Target
from sidecar.config.policy import HardFilters
from sidecar.dialects.apis import Dialect
from sidecar.routing.capabilities import (
    accepts_images,
    reasoning_support,
    structured_output_support,
    tool_support,
)
from sidecar.routing.request import RequestSummary


@dataclass(frozen=True, slots=True)
class Reach:
    """The caller dialects that reach a target: natively, or through a bridge (only in a
    group with `bridges: true`)."""

    native: tuple[Dialect, ...]
    bridged: tuple[Dialect, ...] = ()


Rule = Callable[[RequestSummary, Target, Reach], bool]
BRIDGE_STAGE = "eligibility.bridge_translatable"


# --- baseline eligibility (every strategy) ------------------------------------------------

def api_skin(request: RequestSummary, target: Target, reach: Reach) -> bool:
    """The caller's API reaches the target natively, or through a bridge the group allows."""
    return request.dialect in reach.native or request.dialect in reach.bridged


def bridge_translatable(request: RequestSummary, target: Target, reach: Reach) -> bool:
    """A target reached through a bridge needs a request the bridge can translate."""
    return request.dialect in reach.native or request.bridge_refusal is None


def tool_passthrough(request: RequestSummary, target: Target, _: Reach) -> bool:
    return not request.has_tools or tool_support(target) is not False


def image_modality(request: RequestSummary, target: Target, _: Reach) -> bool:
    return not request.has_images or accepts_images(target) is True


def reasoning_metadata(request: RequestSummary, target: Target, _: Reach) -> bool:
    return not request.reasoning_requested or reasoning_support(target) is True


def honors_max_tokens(request: RequestSummary, target: Target, _: Reach) -> bool:
    return request.max_tokens_cap is None or target.honors_max_tokens


def context_window_tokens(request: RequestSummary, target: Target, _: Reach) -> bool:
    """The estimated prompt plus the caller's output cap fits the target's declared
    window (unknown windows take everything; a provider's own context-length refusal then
    still falls back: envoy_config/upstream_errors.py)."""
    window = target.context_window_tokens
    return window is None or (
        request.estimated_input_tokens + (request.max_tokens_cap or 0) <= window)


def structured_output(request: RequestSummary, target: Target, _: Reach) -> bool:
    """JSON mode or a JSON schema needs a target that declares it (unknown is not enough:
    a target that ignores the format answers free text the caller's parser rejects)."""
    return request.structured_output is None or structured_output_support(target) is True


# --- hard filters (dynamic_score, policy-declared) ----------------------------------------

def require_requested_api_skin(request: RequestSummary, target: Target, reach: Reach) -> bool:
    return request.dialect in reach.native


def require_input_modalities(request: RequestSummary, target: Target,
                             _: Reach) -> bool:
    return not request.has_images or accepts_images(target) is True


def require_tool_support_when_tools_present(request: RequestSummary, target: Target,
                                            _: Reach) -> bool:
    return not request.has_tools or tool_support(target) is True


def require_honors_max_tokens_when_caller_capped(request: RequestSummary, target: Target,
                                                 _: Reach) -> bool:
    return request.max_tokens_cap is None or target.honors_max_tokens


def require_reasoning_support_when_requested(request: RequestSummary, target: Target,
                                             _: Reach) -> bool:
    return not request.reasoning_requested or reasoning_support(target) is True


def require_structured_output_support_when_requested(
        request: RequestSummary, target: Target, _: Reach) -> bool:
    return request.structured_output is None or structured_output_support(target) is True


# (baseline rule, the hard filter on the same subject)
PAIRS: tuple[tuple[Rule, Rule], ...] = (
    (api_skin, require_requested_api_skin),
    (image_modality, require_input_modalities),
    (tool_passthrough, require_tool_support_when_tools_present),
    (honors_max_tokens, require_honors_max_tokens_when_caller_capped),
    (reasoning_metadata, require_reasoning_support_when_requested),
    (structured_output, require_structured_output_support_when_requested),
)


# What each subject means to a caller who got nothing (no target names: those are the
# operator's business). `{dialect}` is the caller's API.
_CALLER_WORDS = (
    "none speaks the {dialect} API",
    "image input needs a target that accepts images",
    "tool use needs a target with tool support",
    "an explicit max-token cap needs a target that honors it",
    "reasoning/thinking needs a target with reasoning support",
    "structured output (JSON mode or a JSON schema) needs a target that declares support",
)
CONTEXT_STAGE = "eligibility.context_window_tokens"
CALLER_WORDS: dict[str, str] = {
    **{f"{prefix}.{rule.__name__}": words
       for (baseline, hard), words in zip(PAIRS, _CALLER_WORDS, strict=True)
       for prefix, rule in (("eligibility", baseline), ("hard_filters", hard))},
    CONTEXT_STAGE: "the prompt and its output cap do not fit any target's context window",
}


def active_rules(hard_filters: HardFilters | None) -> list[tuple[str, Rule]]:
    """The named rules one decision applies: per subject, the hard filter when the group's
    policy enables it, else the baseline rule. Every hard filter excludes at least what its
    baseline rule excludes, so turning a hard filter off never relaxes the baseline."""
    rules: list[tuple[str, Rule]] = []
    for baseline, hard in PAIRS:
        if hard_filters is not None and getattr(hard_filters, hard.__name__):
            rules.append((f"hard_filters.{hard.__name__}", hard))
        else:
            rules.append((f"eligibility.{baseline.__name__}", baseline))
    rules.insert(1, (BRIDGE_STAGE, bridge_translatable))  # right after the API rule
    rules.append((CONTEXT_STAGE, context_window_tokens))
    return rules
