from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RankRequest(_message.Message):
    __slots__ = ("group", "caller", "api", "stream", "request_shape", "prompt_features", "complexity", "prompt_chars", "max_output_tokens", "candidates", "prompt_text")
    class RequestShapeEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REQUEST_SHAPE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FEATURES_FIELD_NUMBER: _ClassVar[int]
    COMPLEXITY_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    group: str
    caller: str
    api: str
    stream: bool
    request_shape: _containers.ScalarMap[str, str]
    prompt_features: _containers.RepeatedScalarFieldContainer[str]
    complexity: str
    prompt_chars: int
    max_output_tokens: int
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    prompt_text: str
    def __init__(self, group: _Optional[str] = ..., caller: _Optional[str] = ..., api: _Optional[str] = ..., stream: _Optional[bool] = ..., request_shape: _Optional[_Mapping[str, str]] = ..., prompt_features: _Optional[_Iterable[str]] = ..., complexity: _Optional[str] = ..., prompt_chars: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., prompt_text: _Optional[str] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("label", "provider", "model", "tags", "weight", "observations")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    label: str
    provider: str
    model: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    weight: int
    observations: Observations
    def __init__(self, label: _Optional[str] = ..., provider: _Optional[str] = ..., model: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., weight: _Optional[int] = ..., observations: _Optional[_Union[Observations, _Mapping]] = ...) -> None: ...

class Observations(_message.Message):
    __slots__ = ("count", "p95_latency_ms", "p95_ttfb_ms", "p95_ms_per_output_token", "output_tokens_per_s", "error_rate", "timeout_rate", "fallback_rate", "cancel_rate")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    P95_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    P95_TTFB_MS_FIELD_NUMBER: _ClassVar[int]
    P95_MS_PER_OUTPUT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_RATE_FIELD_NUMBER: _ClassVar[int]
    FALLBACK_RATE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_RATE_FIELD_NUMBER: _ClassVar[int]
    count: int
    p95_latency_ms: float
    p95_ttfb_ms: float
    p95_ms_per_output_token: float
    output_tokens_per_s: float
    error_rate: float
    timeout_rate: float
    fallback_rate: float
    cancel_rate: float
    def __init__(self, count: _Optional[int] = ..., p95_latency_ms: _Optional[float] = ..., p95_ttfb_ms: _Optional[float] = ..., p95_ms_per_output_token: _Optional[float] = ..., output_tokens_per_s: _Optional[float] = ..., error_rate: _Optional[float] = ..., timeout_rate: _Optional[float] = ..., fallback_rate: _Optional[float] = ..., cancel_rate: _Optional[float] = ...) -> None: ...

class RankResponse(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, targets: _Optional[_Iterable[str]] = ...) -> None: ...
