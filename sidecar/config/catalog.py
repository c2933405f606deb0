"""Built-in catalog of well-known providers.

The SPEC's sample configuration names providers (`baseten`, `minimax`, `openai`) without
declaring them, so a configuration with only `models:` must still know where those live.
A `providers:` entry with the same name overrides any of these keys and keeps the rest.
"""

from __future__ import annotations

from typing import Any

BUILTIN_PROVIDERS: dict[str, dict[str, Any]] = {
    "openai": {
        "base_url": "https://api.openai.com/v1",
        "dialects": ["openai_chat", "openai_responses"],
        "credential": {"env": "OPENAI_API_KEY"},
    },
    "anthropic": {
        "base_url": "https://api.anthropic.com/v1",
        "dialects": ["anthropic_messages"],
        "credential": {"env": "ANTHROPIC_API_KEY"},
    },
    "baseten": {
        "base_url": "https://inference.baseten.co/v1",
        "dialects": ["openai_chat"],
        "credential": {"env": "BASETEN_API_KEY"},
    },
    "minimax": {
        "base_url": "https://api.minimax.io/v1",
        "dialects": ["openai_chat", "anthropic_messages"],
        "dialect_base_urls": {"anthropic_messages": "https://api.minimax.io/anthropic/v1"},
        "credential": {"env": "MINIMAX_API_KEY"},
    },
    "deepseek": {
        "base_url": "https://api.deepseek.com/v1",
        "dialects": ["openai_chat"],
        "credential": {"env": "DEEPSEEK_API_KEY"},
    },
    "groq": {
        "base_url": "https://api.groq.com/openai/v1",
        "dialects": ["openai_chat"],
        "credential": {"env": "GROQ_API_KEY"},
    },
    "together": {
        "base_url": "https://api.together.xyz/v1",
        "dialects": ["openai_chat"],
        "credential": {"env": "TOGETHER_API_KEY"},
    },
    "fireworks": {
        "base_url": "https://api.fireworks.ai/inference/v1",
        "dialects": ["openai_chat"],
        "credential": {"env": "FIREWORKS_API_KEY"},
    },
}
