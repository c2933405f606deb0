"""What real providers do that a happy-path fake does not, as named data.

Each entry is a `Behaviour` (providers.py: the fake providers' knobs) and the public document
it follows. The fault benchmark (bench/fault_scenarios.py), the end-to-end tests and
`sidecar demo-providers --behaviour NAME` all take behaviours from here by name, so what a
test calls "Anthropic overloaded in the stream" is the same bytes everywhere.

Headers and bodies are written from the providers' API references:

- OpenAI: platform.openai.com/docs/guides/rate-limits (the `x-ratelimit-*` headers; reset
  times as durations such as `1s` or `6m0s`), /docs/guides/error-codes (429
  `rate_limit_exceeded`, 500, 503), /docs/guides/prompt-caching (`cached_tokens` inside
  `prompt_tokens`), /docs/api-reference/chat-streaming (the stream's chunks).
- Anthropic: docs.anthropic.com/en/api/rate-limits (`retry-after` in seconds on a 429, the
  `anthropic-ratelimit-*-reset` headers as RFC 3339 times), /en/api/errors (429
  `rate_limit_error`, 500 `api_error`, 529 `overloaded_error`), /en/api/messages-streaming
  (`ping` events anywhere; an `error` event after a 200), /en/docs/build-with-claude/
  prompt-caching (`cache_read_input_tokens` and `cache_creation_input_tokens` beside
  `input_tokens`).
- vLLM's OpenAI-compatible server (docs.vllm.ai, serving/openai_compatible_server): errors
  as `{"object": "error", …}`; no usage in a stream unless `stream_options` asks.
- A CDN in front of a provider (Cloudflare and others): JSON replies with
  `transfer-encoding: chunked` and no `content-length`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sidecar.devstack import provider_wire
from sidecar.devstack.providers import Behaviour


@dataclass(frozen=True)
class NamedBehaviour:
    name: str
    follows: str  # the public document this behaviour is written from
    make: Callable[[], Behaviour]


def _rate_limit_reset_at(seconds: int) -> str:
    """Anthropic's reset headers name a moment (RFC 3339); the fake names one `seconds` from
    now."""
    from datetime import UTC, datetime, timedelta
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _anthropic_rate_limited() -> Behaviour:
    return Behaviour(status=429, headers=(
        ("retry-after", "2"),
        ("anthropic-ratelimit-requests-remaining", "0"),
        ("anthropic-ratelimit-requests-reset", _rate_limit_reset_at(2))))


BEHAVIOURS: dict[str, NamedBehaviour] = {b.name: b for b in (
    NamedBehaviour("chunked_json", "a CDN in front of the provider: chunked JSON replies",
                   lambda: Behaviour(chunked_json=True)),
    NamedBehaviour("invalid_chunked", "RFC 9112 §7.1: a chunk size that is not hex",
                   lambda: Behaviour(invalid_chunked=True)),
    NamedBehaviour("openai_rate_limited", "platform.openai.com/docs/guides/rate-limits",
                   lambda: Behaviour(status=429, headers=(
                       ("x-ratelimit-remaining-requests", "0"),
                       ("x-ratelimit-reset-requests", "2s"),
                       ("x-ratelimit-reset-tokens", "1s")))),
    NamedBehaviour("openai_retry_after", "platform.openai.com/docs/guides/rate-limits "
                   "(and Azure OpenAI's retry-after)",
                   lambda: Behaviour(status=429, headers=(("retry-after", "2"),))),
    NamedBehaviour("anthropic_rate_limited", "docs.anthropic.com/en/api/rate-limits",
                   _anthropic_rate_limited),
    NamedBehaviour("anthropic_overloaded", "docs.anthropic.com/en/api/errors (529)",
                   lambda: Behaviour(status=529)),
    NamedBehaviour("transient_500", "platform.openai.com/docs/guides/error-codes (500: retry)",
                   lambda: Behaviour(status=500, fail_first=1)),
    NamedBehaviour("anthropic_overloaded_in_stream",
                   "docs.anthropic.com/en/api/messages-streaming, error events",
                   lambda: Behaviour(first_event=provider_wire.anthropic_stream_error())),
    NamedBehaviour("openai_error_in_stream",
                   "platform.openai.com/docs/api-reference/chat-streaming",
                   lambda: Behaviour(first_event=provider_wire.openai_stream_error(
                       "The server had an error while processing your request."))),
    NamedBehaviour("slow_first_token", "any provider under load: 200 and headers at once, "
                   "the first event 20 s later", lambda: Behaviour(first_event_delay_s=20.0)),
    NamedBehaviour("stalled_stream", "any provider: a stream that stops sending mid-way",
                   lambda: Behaviour(stall_after_events=3, inter_event_delay_s=0.1)),
    NamedBehaviour("cut_stream", "any provider: a connection lost mid-stream (events 100 ms "
                   "apart, so the caller has the first ones)",
                   lambda: Behaviour(fail_after_events=3, inter_event_delay_s=0.1)),
    NamedBehaviour("garbage_event", "a broken proxy: one event that is not JSON",
                   lambda: Behaviour(garbage_after_events=3)),
    NamedBehaviour("openai_context_length", "platform.openai.com/docs/guides/error-codes "
                   "(400 context_length_exceeded)",
                   lambda: Behaviour(context_window_tokens=64)),
    NamedBehaviour("anthropic_context_length", "docs.anthropic.com/en/api/errors (400 "
                   "invalid_request_error, 'prompt is too long')",
                   lambda: Behaviour(context_window_tokens=64)),
    NamedBehaviour("vllm_context_length", "docs.vllm.ai, OpenAI-compatible server errors",
                   lambda: Behaviour(context_window_tokens=64, vllm_errors=True)),
    *(NamedBehaviour(f"{family.replace('.', '')}_context_length",
                     f"observe/refusal_catalogue.py, {family}'s entry",
                     lambda family=family: Behaviour(context_window_tokens=64,
                                                     refuses_as=family))
      for family in ("llama.cpp", "sglang", "tgi", "gemini", "bedrock", "mistral", "groq",
                     "together", "deepseek", "ollama")),
    # An engine (llama.cpp's llama-server, issue 40) cut by `max_tokens` while it writes a
    # forced tool call: 200, `finish_reason: "length"`, the call's `arguments` cut mid-JSON
    # (platform.openai.com/docs/api-reference/chat/object: "length if the maximum number
    # of tokens specified in the request was reached").
    NamedBehaviour("openai_tool_call_cut_by_max_tokens",
                   "platform.openai.com/docs/api-reference/chat/object (finish_reason)",
                   lambda: Behaviour(call_tools=True, cut_tool_calls=True)),
    NamedBehaviour("no_usage", "an OpenAI-compatible server that reports no usage, "
                   "`stream_options` or not", lambda: Behaviour(reports_usage=False)),
    NamedBehaviour("python_spaced_json", "an OpenAI-compatible server written in Python: "
                   "stream events as `json.dumps` writes them by default (`\"choices\": []`)",
                   lambda: Behaviour(spaced_json=True)),
    NamedBehaviour("llama_cpp_timings", "llama.cpp tools/server/README.md (`timings`) and "
                   "server-task.cpp: `timings` on the stream's last chunk, the usage chunk "
                   "when usage is asked", lambda: Behaviour(engine_timings=True)),
    NamedBehaviour("openai_cached_usage", "platform.openai.com/docs/guides/prompt-caching",
                   lambda: Behaviour(cache_tokens=(1024, 0))),
    NamedBehaviour("anthropic_cache_usage",
                   "docs.anthropic.com/en/docs/build-with-claude/prompt-caching",
                   lambda: Behaviour(cache_tokens=(1024, 256))),
)}


def behaviour(name: str) -> Behaviour:
    """A fresh `Behaviour` for the named entry (KeyError names the known ones)."""
    try:
        return BEHAVIOURS[name].make()
    except KeyError:
        raise KeyError(f"no provider behaviour {name!r}; known: "
                       f"{', '.join(sorted(BEHAVIOURS))}") from None
