"""Provider knowledge: the refusals providers really send, by status, error type, code and
wording, each entry naming the source it follows.

Read by the hold's Lua (envoy_config/refusal_lua.py, generated from these entries), the
reply gate (gateway/reply_gate.py, through refusals.py), the fake providers
(devstack/provider_wire.py sends `example` bodies) and the tests alike, so what a test
calls "llama.cpp's context refusal" is the same bytes everywhere.

Two verdicts:

- `NEXT_TARGET`: the prompt does not fit this model's context window. Another target of
  the group may hold more, so the request goes on to the next *different* target (never
  the same target again: it would answer the same).
- `CALLERS`: a refusal of the request itself that every target would share (a malformed
  body, a request over the provider's size limit). Passed through as sent, never retried;
  known, so not counted as unrecognised.

Matching (refusals.py reads the body as JSON; the Lua must give the same answer on every
entry, tests/unit/observe/test_refusal_catalogue.py): the status equals, and every field
the entry names holds: `error_type` / `error_code` equal the error's `type` / `code`
(lower-cased; a numeric code as its digits), `phrase` is in its message (lower-cased).
Phrases are plain ASCII without quotes, backslashes or slashes, so no JSON writer escapes
them. First match wins: context entries come first.

Ollama mostly has nothing to match: by default (`truncate` and `shift` unset) it fits an
over-long chat to its `num_ctx` itself — older messages dropped (server/prompt.go), then
the prompt cut to the window keeping its first `num_keep` tokens (its log: "truncating
input prompt") — and answers 200 with what the model made of the rest (ollama/ollama#7661,
a maintainer: "only the text within the context window is actually sent to the model").
No gateway can tell that answer from any other. Only where the model cannot shift its
context (`shift: false`, or a family such as deepseek2) does it refuse, with a 400 the
catalogue knows (the `ollama` entries; llm/llama_server.go, server/sched.go,
openai/openai.go of github.com/ollama/ollama at fb30760, 2026-08-21). A caller's
`truncate: false` sends the prompt to llama-server unchanged, and llama-server's own 400
comes back as the text of Ollama's message, which the llama.cpp phrase entry matches.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Verdict(Enum):
    NEXT_TARGET = "context_window"
    CALLERS = "request_error"


@dataclass(frozen=True)
class Refusal:
    provider: str
    status: int
    verdict: Verdict
    source: str  # the document or observation this entry follows
    example: Any  # the body as the provider sends it (JSON value)
    error_type: str | None = None
    error_code: str | None = None
    phrase: str | None = None

    def example_bytes(self, spaced: bool = False) -> bytes:
        """The example as compact JSON, or spaced as Python's json.dumps writes it."""
        separators = (", ", ": ") if spaced else (",", ":")
        return json.dumps(self.example, separators=separators).encode()


def _openai_envelope(message: str, kind: str, code: object, param: object = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


_CONTEXT = Verdict.NEXT_TARGET
_CALLERS = Verdict.CALLERS

CATALOGUE: tuple[Refusal, ...] = (
    # --- context window: another target may hold the prompt ---
    Refusal("openai", 400, _CONTEXT,
            "platform.openai.com/docs/guides/error-codes (code context_length_exceeded)",
            _openai_envelope("This model's maximum context length is 8192 tokens. However, "
                             "your messages resulted in 8227 tokens. Please reduce the length "
                             "of the messages.", "invalid_request_error",
                             "context_length_exceeded", "messages"),
            error_code="context_length_exceeded"),
    Refusal("groq", 400, _CONTEXT,
            "console.groq.com/docs/errors (OpenAI-compatible error object, "
            "code context_length_exceeded)",
            _openai_envelope("Please reduce the length of the messages or completion.",
                             "invalid_request_error", "context_length_exceeded", "messages"),
            error_code="context_length_exceeded"),
    Refusal("anthropic", 400, _CONTEXT,
            "docs.anthropic.com/en/api/errors (400 invalid_request_error); wording "
            "'prompt is too long: N tokens > M maximum'",
            {"type": "error", "error": {"type": "invalid_request_error",
                                        "message": "prompt is too long: 210000 tokens > "
                                                   "200000 maximum"}},
            error_type="invalid_request_error", phrase="prompt is too long"),
    Refusal("llama.cpp", 400, _CONTEXT,
            "llama-server, observed (issue 40): type exceed_context_size_error",
            {"error": {"code": 400, "type": "exceed_context_size_error",
                       "message": "request (1222 tokens) exceeds the available context size "
                                  "(256 tokens), try increasing it"}},
            error_type="exceed_context_size_error"),
    Refusal("llama.cpp", 400, _CONTEXT,
            "llama-server before exceed_context_size_error (tools/server, "
            "invalid_request_error with this wording)",
            {"error": {"code": 400, "type": "invalid_request_error",
                       "message": "the request exceeds the available context size. try "
                                  "increasing the context size or enable context shift"}},
            phrase="exceeds the available context size"),
    Refusal("vllm", 400, _CONTEXT,
            "docs.vllm.ai serving/openai_compatible_server (ErrorResponse); wording "
            "'maximum context length is N tokens' (elotl/GenAI-infra-stack#62)",
            {"object": "error", "message": "This model's maximum context length is 4096 "
             "tokens. However, you requested 6379 tokens (6029 in the messages, 350 in the "
             "completion). Please reduce the length of the messages or completion.",
             "type": "BadRequestError", "param": None, "code": 400},
            phrase="maximum context length"),
    Refusal("vllm", 400, _CONTEXT,
            "vLLM's newer servers wrap the same ErrorResponse in OpenAI's error envelope",
            {"error": {"message": "This model's maximum context length is 4096 tokens. "
                                  "However, you requested 6379 tokens.",
                       "type": "BadRequestError", "param": None, "code": 400}},
            phrase="maximum context length"),
    Refusal("sglang", 400, _CONTEXT,
            "SGLang's OpenAI-compatible server (wording in anomalyco/opencode#25230)",
            {"object": "error", "message": "Requested token count exceeds the model's maximum "
             "context length of 202752 tokens. You requested a total of 202941 tokens: 170941 "
             "tokens from the input messages and 32000 tokens for the completion.",
             "type": "BadRequestError", "param": None, "code": 400},
            phrase="maximum context length"),
    Refusal("deepseek", 400, _CONTEXT,
            "api-docs.deepseek.com/quick_start/error_codes (400 invalid format); body as "
            "reported in evalstate/fast-agent#621 (code invalid_request_error)",
            _openai_envelope("This model's maximum context length is 131072 tokens. However, "
                             "you requested 131134 tokens (122942 in the messages, 8192 in "
                             "the completion). Please reduce the length of the messages or "
                             "completion.", "invalid_request_error", "invalid_request_error"),
            phrase="maximum context length"),
    Refusal("mistral", 400, _CONTEXT,
            "docs.mistral.ai (400 invalid request); wording 'too large for model with N "
            "maximum context length' as users report it",
            {"object": "error", "message": "Prompt contains 40000 tokens and 0 draft tokens, "
             "too large for model with 32768 maximum context length",
             "type": "invalid_request_message_error", "param": None, "code": None},
            phrase="maximum context length"),
    Refusal("gemini", 400, _CONTEXT,
            "ai.google.dev/gemini-api/docs/openai (errors as Google's list of error objects, "
            "status INVALID_ARGUMENT; wording in google-gemini/gemini-cli#6678)",
            [{"error": {"code": 400, "message": "The input token count (1200293) exceeds the "
                        "maximum number of tokens allowed (1048576).",
                        "status": "INVALID_ARGUMENT"}}],
            phrase="exceeds the maximum number of tokens allowed"),
    Refusal("bedrock", 400, _CONTEXT,
            "docs.aws.amazon.com/bedrock/latest/APIReference (ValidationException, 400); "
            "wording in aws-samples/assessment-generator#2",
            {"message": "Input is too long for requested model."},
            phrase="input is too long for requested model"),
    Refusal("tgi", 422, _CONTEXT,
            "huggingface.co/docs/text-generation-inference (422 validation); wording in "
            "huggingface/chat-ui#340",
            {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= "
                      "1512. Given: 1000 `inputs` tokens and 1024 `max_new_tokens`",
             "error_type": "validation"},
            phrase="`max_new_tokens` must be"),
    Refusal("tgi", 422, _CONTEXT,
            "text-generation-inference, input alone over --max-input-length "
            "(huggingface/text-generation-inference#695)",
            {"error": "Input validation error: `inputs` must have less than 1024 tokens. "
                      "Given: 1168", "error_type": "validation"},
            phrase="`inputs` must have less than"),
    Refusal("together", 400, _CONTEXT,
            "docs.together.ai/docs/error-codes (400 invalid request); TGI's wording in "
            "OpenAI's envelope",
            _openai_envelope("Input validation error: `inputs` tokens + `max_new_tokens` must "
                             "be <= 32769. Given: 32000 `inputs` tokens and 2000 "
                             "`max_new_tokens`", "invalid_request_error", None, "max_tokens"),
            phrase="`max_new_tokens` must be"),
    Refusal("ollama", 400, _CONTEXT,
            "github.com/ollama/ollama llm/llama_server.go (fb30760): a prompt over num_ctx "
            "where context shift is off; openai/openai.go's envelope (type "
            "invalid_request_error for a 400) on /v1/chat/completions",
            {"error": {"message": "the prompt is longer than the context length currently "
                                  "available to the model; shorten the prompt, adjust the "
                                  "context length in settings, or use a model with a longer "
                                  "context length",
                       "type": "invalid_request_error", "param": None, "code": None}},
            phrase="longer than the context length currently available"),
    Refusal("ollama", 400, _CONTEXT,
            "the same on Ollama's native /api/chat (docs/api/errors.mdx: the message in "
            "`error`)",
            {"error": "the prompt is longer than the context length currently available to "
                      "the model; shorten the prompt, adjust the context length in settings, "
                      "or use a model with a longer context length"},
            phrase="longer than the context length currently available"),
    # --- the request's own fault: every target would refuse it ---
    Refusal("anthropic", 413, _CALLERS,
            "docs.anthropic.com/en/api/errors (413 request_too_large)",
            {"type": "error", "error": {"type": "request_too_large",
                                        "message": "Request exceeds the maximum allowed number "
                                                   "of bytes."}},
            error_type="request_too_large"),
    Refusal("anthropic", 400, _CALLERS,
            "docs.anthropic.com/en/api/errors (400 invalid_request_error)",
            {"type": "error", "error": {"type": "invalid_request_error",
                                        "message": "messages: field required"}},
            error_type="invalid_request_error"),
    Refusal("openai", 400, _CALLERS,
            "platform.openai.com/docs/guides/error-codes (400 invalid_request_error)",
            _openai_envelope("Invalid value for 'temperature'.", "invalid_request_error",
                             "invalid_value", "temperature"),
            error_type="invalid_request_error"),
    Refusal("vllm", 400, _CALLERS,
            "docs.vllm.ai serving/openai_compatible_server (ErrorResponse BadRequestError)",
            {"object": "error", "message": "[{'type': 'missing', 'loc': ('body', 'messages')}]",
             "type": "BadRequestError", "param": None, "code": 400},
            error_type="badrequesterror"),
    Refusal("tgi", 422, _CALLERS,
            "huggingface.co/docs/text-generation-inference (422 validation)",
            {"error": "Input validation error: `temperature` must be strictly positive",
             "error_type": "validation"},
            error_type="validation"),
)

# The statuses a refusal of the catalogue may have: a reply with another status is never
# read for one (and a 4xx among these that no entry matches is counted as unrecognised).
REFUSAL_STATUSES: frozenset[int] = frozenset(entry.status for entry in CATALOGUE) | {400}


def examples(provider: str, verdict: Verdict = Verdict.NEXT_TARGET) -> list[Refusal]:
    """The entries of a provider family (the fake providers send the first)."""
    return [e for e in CATALOGUE if e.provider == provider and e.verdict is verdict]
