"""The question put to an external routing service: safe features of one request and the
targets it may name (proto/sidecar/external/v1/router.proto).

Only what the decision trace may hold goes out — buckets, feature names, counts, the
caller's configured name, candidate labels, tags, weights and observation figures — unless
the group opted into `send_prompt_text`, which adds the prompt sample the routing core
already holds (at most `max_scan_bytes`)."""

from __future__ import annotations

from sidecar.config.models import ModelGroup
from sidecar.external.v1.router_pb2 import Candidate, Observations, RankRequest
from sidecar.routing.decision import TargetChoice
from sidecar.routing.observations import ObservationView, TargetObservations
from sidecar.routing.request import RequestSummary
from sidecar.routing.signals import complexity, prompt_feature_detector, request_shape_buckets

_OPTIONAL_FIGURES = ("p95_latency_ms", "p95_ttfb_ms", "p95_ms_per_output_token",
                     "output_tokens_per_s")


class QueryBuilder:
    """One per external group: its feature detector and window, resolved once."""

    def __init__(self, group: ModelGroup) -> None:
        assert group.external is not None
        self._signals = group.dynamic_score.signals
        self._detect = prompt_feature_detector(self._signals)
        self._window = group.dynamic_score.observation_window_seconds
        self._send_text = group.external.send_prompt_text

    def __call__(self, request: RequestSummary, candidates: list[TargetChoice],
                 observations: ObservationView) -> RankRequest:
        features = self._detect(request)
        level = complexity(request, features, self._signals)
        shape = {name: str(value).lower() if isinstance(value, bool) else str(value)
                 for name, value in request_shape_buckets(request).items()}
        return RankRequest(
            group=request.group, caller=request.caller, api=request.dialect.value,
            stream=request.stream, request_shape=shape,
            prompt_features=sorted(f.value for f in features),
            complexity=level.bucket.value if level else "",
            prompt_chars=request.prompt_chars,
            max_output_tokens=request.max_tokens_cap or 0,
            candidates=[_candidate(c, observations.get(c.label, self._window))
                        for c in candidates],
            prompt_text=request.prompt_sample if self._send_text else "")


def _candidate(choice: TargetChoice, figures: TargetObservations) -> Candidate:
    target = choice.target
    observed = Observations(count=figures.count, error_rate=figures.error_rate,
                            timeout_rate=figures.timeout_rate,
                            fallback_rate=figures.fallback_rate,
                            cancel_rate=figures.cancel_rate)
    for name in _OPTIONAL_FIGURES:
        value = getattr(figures, name)
        if value is not None:
            setattr(observed, name, value)
    return Candidate(label=choice.label, provider=target.provider, model=target.model_ref,
                     tags=list(target.tags), weight=target.weight, observations=observed)
