"""The `routing_policy.dynamic_score` block, one model per sub-block, defaults declared here once.

Key names are the contract from SPEC.md; docs/configuration.md documents each default.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, field_validator

from sidecar.config.fields import (
    Fraction,
    NonBlank,
    NonNegativeFloat,
    NonNegativeInt,
    Percent,
    PositiveFloat,
    PositiveInt,
    StrictModel,
    bounded,
)
from sidecar.routing.expression import ExpressionError, compile_expression


class Complexity(StrEnum):
    """Ordered request-complexity buckets (declaration order is the order)."""

    SIMPLE = "simple"
    STANDARD = "standard"
    COMPLEX = "complex"

    @property
    def rank(self) -> int:
        return list(Complexity).index(self)


class PromptFeature(StrEnum):
    CODE = "code"
    DIFF = "diff"
    STACK_TRACE = "stack_trace"
    SUMMARIZE = "summarize"
    EXTRACT = "extract"
    SECURITY_REVIEW = "security_review"
    TOOL_AGENT = "tool_agent"


class Affinity(StrictModel):
    enabled: bool = True
    ttl_seconds: PositiveInt = 600
    max_entries: PositiveInt = 10_000


class HardFilters(StrictModel):
    require_requested_api_skin: bool = True
    require_input_modalities: bool = True
    require_tool_support_when_tools_present: bool = True
    require_honors_max_tokens_when_caller_capped: bool = True
    require_reasoning_support_when_requested: bool = False
    require_structured_output_support_when_requested: bool = True


class Signal(StrictModel):
    enabled: bool = True


class PromptFeatures(StrictModel):
    enabled: bool = True
    max_scan_bytes: PositiveInt = 16_384
    features: list[PromptFeature] = Field(default_factory=lambda: list(PromptFeature))


class Signals(StrictModel):
    request_shape: Signal = Signal()
    prompt_features: PromptFeatures = PromptFeatures()
    complexity: Signal = Signal()
    observed_performance: Signal = Signal()
    cost: Signal = Signal()
    evaluation_metadata: Signal = Signal()


class TermCondition(StrictModel):
    complexity_lte: Complexity | None = None
    complexity_gte: Complexity | None = None


class ScoreTerm(StrictModel):
    name: NonBlank
    when: TermCondition = TermCondition()
    require_tags: list[str] = Field(default_factory=list)
    expression: NonBlank

    @field_validator("expression")
    @classmethod
    def _expression_compiles(cls, value: str) -> str:
        try:
            compile_expression(value)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None
        return value


class Thresholds(StrictModel):
    max_error_rate: Fraction | None = None
    max_timeout_rate: Fraction | None = None
    max_p95_latency_ms: PositiveFloat | None = None
    # Evidence a threshold needs before it removes a target (routing/thresholds.py): this
    # many observations in the window (unset: the policy's `min_observations`), and, for a
    # rate, a one-sided lower confidence bound (Wilson) above the limit at this level
    # (0.5: the rate itself). Re-admission after probing asks the same of the upper bound.
    min_observations: NonNegativeInt | None = None
    confidence: Annotated[float, bounded(0.5, 0.999)] = 0.95


class DynamicScorePolicy(StrictModel):
    cold_start_policy: Literal["configured_weight"] = "configured_weight"
    min_observations: NonNegativeInt = 20
    observation_window_seconds: PositiveInt = 600
    max_score_adjustment_percent: Percent = 70
    # How strongly the adjustable share goes to the better-scoring warm targets
    # (routing/blend.py): a term value higher by d earns e^(sharpness·d) times as much.
    blend_sharpness: Annotated[NonNegativeFloat, bounded(0, 100)] = 8.0
    affinity: Affinity = Affinity()
    hard_filters: HardFilters = HardFilters()
    signals: Signals = Signals()
    score_terms: list[ScoreTerm] = Field(default_factory=list)
    thresholds: Thresholds = Thresholds()
    # What `thresholds.max_p95_latency_ms` and `latency_score` compare: the observed p95
    # latency, as the SPEC says (the default), or `work_normalized`, the p95 on equal work
    # (p95 TTFB + a 256-token reply at the p95 time per output token), which does not count
    # against a target the long-output requests it happens to receive (docs/dynamic-score.md).
    latency_basis: Literal["observed_p95", "work_normalized"] = "observed_p95"


class RoutingPolicy(StrictModel):
    dynamic_score: DynamicScorePolicy | None = None
