"""What the routing core knows about one request: a summary of its shape, never its content.

`prompt_sample` is the one exception: up to `max_scan_bytes` of prompt text, kept only so the
`prompt_features` signal can look for features. It is excluded from `repr` and never copied
into a decision or trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.dialects.apis import Dialect


@dataclass(frozen=True, slots=True)
class Reasoning:
    """Normalized reasoning/thinking request: OpenAI `reasoning_effort` / `reasoning.effort`,
    Anthropic `thinking.budget_tokens`."""

    effort: str | None = None
    budget_tokens: int | None = None


# What a request without an output cap is expected to produce, unless its group says
# (`models.<group>.output_budget_tokens`).
DEFAULT_OUTPUT_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class RequestSummary:
    group: str
    caller: str
    dialect: Dialect
    stream: bool = False
    has_tools: bool = False
    tool_forced: bool = False
    has_images: bool = False
    reasoning: Reasoning | None = None
    max_tokens_cap: int | None = None
    prompt_chars: int = 0
    prompt_sample: str = field(default="", repr=False)
    spend_ceiling_usd: float | None = None
    # SHA-256 of the normalized conversation opening (dialects/conversation.py); None when
    # the request has no conversation or belongs to an explicit stateful session.
    conversation_key: bytes | None = field(default=None, repr=False)
    # `json_object` or `json_schema` when the caller asked for structured output
    structured_output: str | None = None
    # Why this request cannot cross a bridge (`field: reason`), when its group bridges and
    # the translation refused it; targets reached only through a bridge are then ineligible.
    bridge_refusal: str | None = None
    # The group's expected output of an uncapped request (output_budget).
    default_output_tokens: int = DEFAULT_OUTPUT_TOKENS
    # How much of the caller's daily spend budget is used, 0–1 in steps of 0.01 (quotas:
    # `spend_per_day_usd`; 0 without one): the `budget_pressure` score (scores.py).
    budget_pressure: float = 0.0
    # The prompt features already found, by name, when there is no prompt to scan: a
    # logged request re-decided by `sidecar replay` (evaluation/). None: scan the sample.
    known_features: frozenset[str] | None = None

    @property
    def reasoning_requested(self) -> bool:
        return self.reasoning is not None

    @property
    def output_budget(self) -> int:
        """The output this request is expected to produce at most: its cap, or its group's
        default. Spend ceilings, `cost_score` and the usage charged when a reply's usage
        cannot be read all count with it (billing.py)."""
        return self.max_tokens_cap or self.default_output_tokens

    @property
    def estimated_input_tokens(self) -> int:
        """Rough token estimate (4 characters per token) used for cost and size buckets."""
        return (self.prompt_chars + 3) // 4
