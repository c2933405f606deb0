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
| `extract` detected; `summarize` detected in an input of ≥ 250 estimated tokens (a page) | 1 |
| each detected heavy feature (`code`, `diff`, `stack_trace`, `security_review`, | 1 |
| `tool_agent`; with tools present, tools and `tool_agent` are one point together) | |
| a hard task, beyond its parts (at most once): debugging (`stack_trace` with `code` or | 1 |
| `diff`), a code change (`diff` with `code`), a security review of code, an agent task | |
| over code (`tool_agent` with `code`, `diff` or `stack_trace`), long code (`code` in an | |
| input of ≥ 2,000 estimated tokens or with an output cap ≥ 4,096), a long document (an | |
| input of ≥ 8,000 estimated tokens); size and cap parts need request_shape | |

So a debugging request (code plus its stack trace), a long code input, a security review of
code or a long document is `complex`, while a short code question or one tool call stays
`standard`. Tested against thirty-one prompts labelled by a reader
(tests/fixtures/complexity_prompts.py, issue #31.3).
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
_AGENT_WORK = frozenset({PromptFeature.CODE, PromptFeature.DIFF, PromptFeature.STACK_TRACE})
PAGE_TOKENS = 250
LONG_INPUT_TOKENS = 2_000
LONG_DOCUMENT_TOKENS = 8_000
LONG_OUTPUT_TOKENS = 4_096

FeatureDetector = Callable[[RequestSummary], frozenset[PromptFeature]]


def prompt_feature_detector(signals: Signals) -> FeatureDetector:
    """The `prompt_features` signal of one group, resolved once at configuration load."""
    config = signals.prompt_features
    if not config.enabled:
        return lambda request: _NO_FEATURES
    scan = detector(config.features)
    tool_agent = PromptFeature.TOOL_AGENT in config.features

    def features_of(request: RequestSummary) -> frozenset[PromptFeature]:
        if request.known_features is not None:  # a logged request: what was found then
            return frozenset(f for f in config.features if f.value in request.known_features)
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
    long_input = long_output = long_document = False
    if signals.request_shape.enabled:
        tokens = request.estimated_input_tokens
        long_input = tokens >= LONG_INPUT_TOKENS
        long_document = tokens >= LONG_DOCUMENT_TOKENS
        points += long_input + long_document + (tokens >= 32_000)
        points += request.has_images + request.reasoning_requested
        if request.has_tools:  # tools are one point, whether or not they make it an agent
            points += PromptFeature.TOOL_AGENT not in features
        cap = request.max_tokens_cap or 0
        long_output = cap >= LONG_OUTPUT_TOKENS
        points += long_output + (cap >= 16_384)
    points += PromptFeature.EXTRACT in features or (
        PromptFeature.SUMMARIZE in features and request.estimated_input_tokens >= PAGE_TOKENS)
    if features or long_document:
        points += _hard_task(features, long_input or long_output, long_document)
    if points == 0:
        bucket = Complexity.SIMPLE
    elif points <= 2:
        bucket = Complexity.STANDARD
    else:
        bucket = Complexity.COMPLEX
    return ComplexityResult(bucket, points)


def _hard_task(features: frozenset[PromptFeature], long_code: bool, long_document: bool) -> bool:
    """Combinations that make a task harder than the sum of its markers: debugging (a stack
    trace with the code or diff it came from), a code change (a diff with code), a security
    review of code, an agent task over code, long code (in or out) and a long document.
    Each marker alone is one point; these take the request to `complex`."""
    code = PromptFeature.CODE in features
    in_code = not features.isdisjoint(_CODE_CONTEXT)
    debugging = PromptFeature.STACK_TRACE in features and in_code
    code_change = code and PromptFeature.DIFF in features
    reviewed = PromptFeature.SECURITY_REVIEW in features and in_code
    agent = PromptFeature.TOOL_AGENT in features and not features.isdisjoint(_AGENT_WORK)
    return (debugging or code_change or reviewed or agent or (code and long_code)
            or long_document)
