"""Request-side signals: `request_shape` buckets, `prompt_features`, and `complexity`.

All three are pure functions of the request summary and the group's `signals` block. They
never return prompt text, only bucket names, so their output is safe for traces and logs.

Complexity points (the bucket is `simple` at 0, `standard` at 1–2, `complex` at 3 or more;
`complexity_score` is points / 6, capped at 1):

| input (request_shape must be enabled) | points |
| --- | --- |
| estimated input tokens ≥ 2,000 / ≥ 8,000 / ≥ 32,000 | 1 / 2 / 3 |
| tools present | 1 |
| images present | 1 |
| output budget (explicit cap) ≥ 4,096 / ≥ 16,384 | 1 / 2 |
| reasoning requested | 1 |
| each detected heavy feature (`code`, `diff`, `stack_trace`, `security_review`, | 1 |
| `tool_agent`) | |
| a hard task, beyond its parts (at most once): debugging (`stack_trace` with `code` or | 1 |
| `diff`), a code change (`diff` with `code`), or long code (`code` in an input of ≥ | |
| 2,000 estimated tokens; needs request_shape) | |

So a debugging request (code plus its stack trace) or a long code input is `complex`,
while a short code question stays `standard`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sidecar.config.policy import Complexity, PromptFeature, Signals
from sidecar.routing.prompt_features import detector
from sidecar.routing.request import RequestSummary

_HEAVY_FEATURES = frozenset({PromptFeature.CODE, PromptFeature.DIFF, PromptFeature.STACK_TRACE,
                             PromptFeature.SECURITY_REVIEW, PromptFeature.TOOL_AGENT})
_NO_FEATURES: frozenset[PromptFeature] = frozenset()
_CODE_CONTEXT = frozenset({PromptFeature.CODE, PromptFeature.DIFF})
LONG_INPUT_TOKENS = 2_000

FeatureDetector = Callable[[RequestSummary], frozenset[PromptFeature]]


def prompt_feature_detector(signals: Signals) -> FeatureDetector:
    """The `prompt_features` signal of one group, resolved once at configuration load."""
    config = signals.prompt_features
    if not config.enabled:
        return lambda request: _NO_FEATURES
    scan = detector(config.features)
    tool_agent = PromptFeature.TOOL_AGENT in config.features

    def features_of(request: RequestSummary) -> frozenset[PromptFeature]:
        found = scan(request.prompt_sample)
        if tool_agent and request.has_tools:
            found.add(PromptFeature.TOOL_AGENT)
        return frozenset(found)

    return features_of


def size_bucket(tokens: int) -> str:
    if tokens >= 32_000:
        return "xl"
    if tokens >= 8_000:
        return "large"
    if tokens >= 2_000:
        return "medium"
    return "small"


def cap_bucket(cap: int | None) -> str:
    if cap is None:
        return "none"
    if cap <= 16:
        return "tiny"
    if cap < 4_096:
        return "normal"
    if cap < 16_384:
        return "large"
    return "xl"


def request_shape_buckets(request: RequestSummary) -> dict[str, str | bool]:
    """Safe scalar description of the request (the `request_shape` signal)."""
    return {
        "dialect": request.dialect.value,
        "stream": request.stream,
        "tools": "forced" if request.tool_forced else ("present" if request.has_tools else "none"),
        "images": request.has_images,
        "reasoning": request.reasoning_requested,
        "structured_output": request.structured_output or "none",
        "max_tokens_cap": cap_bucket(request.max_tokens_cap),
        "input_size": size_bucket(request.estimated_input_tokens),
    }


@dataclass(frozen=True, slots=True)
class ComplexityResult:
    bucket: Complexity
    points: int

    @property
    def score(self) -> float:
        return min(1.0, self.points / 6)


def complexity(request: RequestSummary, features: frozenset[PromptFeature],
               signals: Signals) -> ComplexityResult | None:
    """The ordered complexity bucket, or None when the `complexity` signal is disabled."""
    if not signals.complexity.enabled:
        return None
    points = len(features & _HEAVY_FEATURES)
    long_input = False
    if signals.request_shape.enabled:
        tokens = request.estimated_input_tokens
        long_input = tokens >= LONG_INPUT_TOKENS
        points += long_input + (tokens >= 8_000) + (tokens >= 32_000)
        points += request.has_tools + request.has_images + request.reasoning_requested
        cap = request.max_tokens_cap or 0
        points += (cap >= 4_096) + (cap >= 16_384)
    if features:
        points += _hard_task(features, long_input)
    if points == 0:
        bucket = Complexity.SIMPLE
    elif points <= 2:
        bucket = Complexity.STANDARD
    else:
        bucket = Complexity.COMPLEX
    return ComplexityResult(bucket, points)


def _hard_task(features: frozenset[PromptFeature], long_input: bool) -> bool:
    """Combinations that make a task harder than the sum of its markers: debugging (a stack
    trace with the code or diff it came from), a code change (a diff with code), and long
    code. Each marker alone is one point; these take the request to `complex`."""
    code = PromptFeature.CODE in features
    debugging = PromptFeature.STACK_TRACE in features and not features.isdisjoint(_CODE_CONTEXT)
    code_change = code and PromptFeature.DIFF in features
    return debugging or code_change or (code and long_input)
